"""A real Jupyter kernel for tests that need one: what a cell returned and showed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from .helpers import below_with_warm_ranks

# Every cell a test sends asks the kernel not to abort its queue when the cell fails. ipykernel 7
# sends a failed cell's reply first and starts aborting after it, so a cell sent at once on that
# reply was sometimes aborted unrun (status "aborted") on a loaded machine: a race in the kernel,
# not in the code under test.
NO_ABORT = False


def reply_to(client: Any, msg_id: str, timeout: float) -> dict[str, Any]:
    """The shell reply to request ``msg_id``. Replies to other requests are passed over: on a
    loaded machine ``start_new_kernel``'s wait for the kernel can send a second kernel_info
    request, whose reply then comes where the next execute's was expected."""
    deadline = time.monotonic() + timeout
    while True:
        reply: dict[str, Any] = client.get_shell_msg(timeout=max(0.0, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


@dataclass
class Outcome:
    status: str
    ename: str = ""
    evalue: str = ""
    value: str = ""  # the cell's Out, as text
    shown: list[str] = field(default_factory=list)  # printed text and displayed HTML


@dataclass
class Kernel:
    """A real IPython kernel (jupyter_client) that runs cells and keeps what they show."""

    manager: Any
    client: Any

    def run(self, code: str, timeout: float = 300) -> Outcome:
        outcome = Outcome("")

        def collect(message: dict) -> None:
            content = message["content"]
            if message["msg_type"] == "execute_result":
                outcome.value = content["data"]["text/plain"]
            elif message["msg_type"] == "stream":
                outcome.shown.append(content["text"])
            elif message["msg_type"] in ("display_data", "update_display_data"):
                outcome.shown.append(content["data"].get("text/html", ""))

        reply = self.client.execute_interactive(
            code, timeout=timeout, output_hook=collect, stop_on_error=NO_ABORT
        )["content"]
        outcome.status, outcome.ename = reply["status"], reply.get("ename", "")
        outcome.evalue = reply.get("evalue", "")
        if outcome.status != "ok":  # in full under "Packed stdout" if the test fails
            print(f"the cell failed: {outcome.ename}: {outcome.evalue}")
        return outcome

    def processes(self) -> list[psutil.Process]:
        """What runs below the kernel, its warm ranks with it."""
        return below_with_warm_ranks(psutil.Process(self.manager.provisioner.process.pid))
