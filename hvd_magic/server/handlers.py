"""The server extension's REST API and websocket, each behind Jupyter's authentication (the
server's token or login cookie; a request without it gets 403 and nothing of any kernel) and its
authorizer, as the kernels' own API is: reading runs (a timeline window's detail too) needs
``read`` on ``kernels``, a stop or a stacks request ``write`` (a server's custom ``Authorizer``
may allow one and not the other)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, cast

from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import ensure_async, url_path_join
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from hvd_magic.protocol.panel import endpoint_folder
from hvd_magic.server.kernels import STACKS_SECONDS, TIMELINE_SECONDS, KernelRuns

__all__ = ["add_handlers"]

AUTH_RESOURCE = "kernels"  # a run is a kernel's: who may read or act on kernels may on their runs
UPDATE_SECONDS = 1.0  # the websocket's pace: the panel shows steps/s and ETAs that move
Handler = Callable[..., Awaitable[None]]
authorized_to_read = cast(Callable[[Handler], Handler], authorized("read"))  # whatever the method
RUN = r"/hvd-magic/runs/(?P<kernel>[\w-]+)/(?P<number>[0-9]{1,9})"


async def notebooks(session_manager: Any) -> dict[str, str]:
    """Each kernel's notebook (its session's path), by kernel id."""
    sessions = await session_manager.list_sessions()
    return {s["kernel"]["id"]: s.get("path", "") for s in sessions if s.get("kernel")}


class RunsHandler(APIHandler):
    """Base: the kernels this server runs, their notebooks, and the endpoints to ask."""

    auth_resource = AUTH_RESOURCE  # each method's action: read for GET, write for POST

    @property
    def kernel_runs(self) -> KernelRuns:
        return self.settings["hvd_magic_runs"]  # type: ignore[no-any-return]

    async def notebooks(self) -> dict[str, str]:
        return await notebooks(self.session_manager)

    def known(self) -> set[str]:
        return set(self.kernel_manager.list_kernel_ids())

    async def ask(self, kernel: str, request: dict[str, Any], seconds: float | None = None) -> Any:
        endpoint = self.kernel_runs.endpoints(self.known()).get(kernel)
        if endpoint is None:
            raise web.HTTPError(404, f"kernel {kernel} of this server has no hvd_magic runs")
        answer = await self.kernel_runs.ask(endpoint, request, *([seconds] if seconds else []))
        if "refused" in answer:
            raise web.HTTPError(404 if "no run" in answer["refused"] else 409, answer["refused"])
        return answer


class ListHandler(RunsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(await self.kernel_runs.overview(self.known(), await self.notebooks())))


class RunHandler(RunsHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel: str, number: str) -> None:
        per_rank = self.get_argument("per_rank", "1") != "0"
        answer = await self.ask(kernel, {"ask": "run", "number": int(number), "per_rank": per_rank})
        notebook = (await self.notebooks()).get(kernel, "")
        self.finish(
            json.dumps(answer["run"] | {"id": f"{kernel}/{number}", "kernel": kernel, "notebook": notebook})
        )


class StopHandler(RunsHandler):
    @web.authenticated
    @authorized
    async def post(self, kernel: str, number: str) -> None:
        body = self.get_json_body()
        body = {} if body is None else body
        at_once = body.get("at_once", False) if isinstance(body, dict) else None
        if not isinstance(at_once, bool):
            raise web.HTTPError(
                400, 'the body is {"at_once": true} (stop now) or {"at_once": false}, or none'
            )
        self.finish(
            json.dumps(await self.ask(kernel, {"ask": "stop", "number": int(number), "at_once": at_once}))
        )


class StacksHandler(RunsHandler):
    @web.authenticated
    @authorized
    async def post(self, kernel: str, number: str) -> None:
        self.finish(
            json.dumps(await self.ask(kernel, {"ask": "stacks", "number": int(number)}, STACKS_SECONDS))
        )


class TimelineHandler(RunsHandler):
    """The run's Horovod Timeline for the viewer in its tab: GET its data when newer than
    ``?version=``, POST the viewer's request for a window's detail."""

    @web.authenticated
    @authorized
    async def get(self, kernel: str, number: str) -> None:
        version = self.get_argument("version", "-1")
        if not re.fullmatch(r"-?[0-9]{1,18}", version):
            raise web.HTTPError(400, f"version={version!r}: a number (the version the tab shows)")
        request = {"ask": "timeline", "number": int(number), "version": int(version)}
        self.finish(json.dumps(await self.ask(kernel, request, TIMELINE_SECONDS)))

    @web.authenticated
    @authorized_to_read  # a window's detail: a read, though its request is a body
    async def post(self, kernel: str, number: str) -> None:
        body = self.get_json_body()
        window = body.get("window") if isinstance(body, dict) else None
        if not isinstance(window, dict):
            raise web.HTTPError(400, "the body is {\"window\": the viewer's request for a window's detail}")
        request = {"ask": "timeline", "number": int(number), "window": window}
        self.finish(json.dumps(await self.ask(kernel, request, TIMELINE_SECONDS)))


class UpdatesHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """The runs and sessions, sent on opening and every ``UPDATE_SECONDS`` while the socket is open."""

    task: asyncio.Task[None] | None = None

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        if not await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "read", AUTH_RESOURCE)
        ):
            raise web.HTTPError(403, f"not authorized to read {AUTH_RESOURCE}")
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open()
        self.task = asyncio.ensure_future(self._send())

    async def _send(self) -> None:
        runs: KernelRuns = self.settings["hvd_magic_runs"]
        while True:
            known = set(self.kernel_manager.list_kernel_ids())
            overview = await runs.overview(known, await notebooks(self.session_manager))
            try:
                await self.write_message(json.dumps(overview))
            except WebSocketClosedError:  # closed between two sends: on_close ends the task too
                return
            await asyncio.sleep(UPDATE_SECONDS)

    def on_close(self) -> None:
        if self.task is not None:
            self.task.cancel()


def add_handlers(serverapp: Any) -> None:
    web_app = serverapp.web_app
    web_app.settings["hvd_magic_runs"] = KernelRuns(endpoint_folder(serverapp.runtime_dir))
    base = web_app.settings["base_url"]
    routes: list[tuple[str, type[Any]]] = [
        (r"/hvd-magic/runs", ListHandler),
        (RUN, RunHandler),
        (RUN + r"/stop", StopHandler),
        (RUN + r"/stacks", StacksHandler),
        (RUN + r"/timeline", TimelineHandler),
        (r"/hvd-magic/updates", UpdatesHandler),
    ]
    web_app.add_handlers(".*$", [(url_path_join(base, route), handler) for route, handler in routes])
