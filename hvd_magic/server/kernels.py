"""The run endpoints of this server's kernels, asked (``protocol.panel``): ZeroMQ from the
server's event loop, one short-lived socket a request, each with its kernel's token and the time
after which its answer is no use (a kernel busy past it does not act on it). The kernels are
asked at once, and a kernel that does not answer in time keeps the runs it listed last."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from hvd_magic.protocol.panel import Endpoint, read_endpoints

__all__ = ["ASK_SECONDS", "STACKS_SECONDS", "TIMELINE_SECONDS", "KernelRuns"]

ASK_SECONDS = 5.0  # a kernel busy in a C call may answer late; the panel goes on without it
STACKS_SECONDS = 10.0  # the ranks' stacks: the kernel asks each rank (up to 3 s) first
TIMELINE_SECONDS = 60.0  # a timeline: the kernel reads what the file gained (a large one, once, whole)


class KernelRuns:
    """Asks the endpoints in ``folder`` whose kernel ``known`` (this server's kernel ids)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.context = zmq.asyncio.Context()
        self._listed: dict[str, dict[str, Any]] = {}  # each kernel's last answer to "runs"

    def endpoints(self, known: set[str]) -> dict[str, Endpoint]:
        return {e.kernel: e for e in read_endpoints(self.folder) if e.kernel in known}

    async def ask(self, endpoint: Endpoint, request: dict[str, Any], seconds: float = ASK_SECONDS) -> Any:
        """The kernel's answer, or ``{"refused": ...}`` if it gave none within ``seconds``."""
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        asked = request | {"token": endpoint.token, "until": time.time() + seconds}
        try:
            socket.connect(endpoint.address)
            await socket.send_multipart([b"", json.dumps(asked).encode()])
            if not await socket.poll(seconds * 1000):
                return {"refused": f"kernel {endpoint.kernel} did not answer within {seconds:.0f} s (busy?)"}
            return json.loads((await socket.recv_multipart())[-1])
        finally:
            socket.close(linger=0)

    async def overview(
        self, known: set[str], notebooks: dict[str, str], seconds: float = ASK_SECONDS
    ) -> dict[str, list[dict[str, Any]]]:
        """Every kept run and every live session of the kernels in ``known``, each with its
        kernel and notebook (a run with its id, ``KERNEL/N``); live runs first, then the newest.
        A kernel busy past ``seconds`` (a large timeline read, say) is shown as it last answered."""
        endpoints = self.endpoints(known)
        answers = await asyncio.gather(*(self.ask(e, {"ask": "runs"}, seconds) for e in endpoints.values()))
        self._listed = {k: v for k, v in self._listed.items() if k in endpoints}
        runs, sessions = [], []
        for kernel, answer in zip(endpoints, answers, strict=True):
            if "refused" in answer:
                answer = self._listed.get(kernel, answer)
            else:
                self._listed[kernel] = answer
            where = {"kernel": kernel, "notebook": notebooks.get(kernel, "")}
            runs += [run | where | {"id": f"{kernel}/{run['number']}"} for run in answer.get("runs", [])]
            sessions += [session | where for session in answer.get("sessions", [])]
        runs.sort(key=lambda run: (run["state"] != "running", -run["began"]))
        return {"runs": runs, "sessions": sessions}

    def close(self) -> None:
        self.context.term()
