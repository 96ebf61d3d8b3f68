"""``hvd_magic.Session``: a live session from Python (scripts, or notebooks without the magic)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from IPython.core.error import UsageError

from hvd_magic.errors import SessionEnded
from hvd_magic.options import OptionError, make_options
from hvd_magic.options.option import SESSION, SESSION_RUN
from hvd_magic.options.parse import parse_timeout
from hvd_magic.options.run_options import keywords
from hvd_magic.run.packing import pack_function
from hvd_magic.session.commands import (
    parse_ranks,
    session_cell_options,
    stacks_text,
    status_text,
    timeline_ready,
)
from hvd_magic.session.live import LiveSession

__all__ = ["Session"]


class Session:
    """Ranks started once that keep their state across calls, as ``%horovod start`` does.

    >>> with hvd_magic.Session(np=-2) as session:          # doctest: +SKIP
    ...     session.run(build_model)                        # defines globals on every rank
    ...     session.run(train, epochs=2)                    # finds them there
    ...     session.run(evaluate, ranks=[0])                # on rank 0 only: no collectives

    Horovod (or, with ``backend="torch"``, torch.distributed) is initialised once when the
    session starts. Options are ``HorovodRunner``'s; ``idle`` ends the session after that many
    seconds without a call; ``timeline=True`` readies the ranks to record a call's Horovod
    Timeline (``run(..., timeline="t.json")``; as ``%horovod start timeline=yes``). A function's
    globals are the rank's ``__main__`` namespace, kept between calls.
    """

    def __init__(
        self,
        np: int,
        *,
        launcher: str | None = None,
        backend: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        data: Any = None,
        remainder: str | None = None,
        idle: float | None = None,
        oversubscribe: bool = False,
        timeline: bool = False,
        stragglers: str | None = None,
    ) -> None:
        given = keywords(SESSION, locals())  # the table's for Session (tests/test_options_table.py)
        del given["idle"], given["timeline"]  # the session's own: read here
        try:
            options = make_options(**given)
            idle_seconds = parse_timeout(idle)
            timeline = timeline_ready("yes" if timeline else None, options)
        except (OptionError, UsageError) as err:
            raise ValueError(str(err)) from None
        self._live = LiveSession(options, idle_seconds, timeline)
        self.summary = self._live.start()

    def run(
        self,
        main: Callable[..., Any],
        *,
        ranks: list[int] | None = None,
        timeline: str | None = None,
        logdir: str | None = None,
        mlflow: bool | None = None,
        stragglers: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``main(**kwargs)`` on every rank (or on ``ranks``); the value of the lowest of them.
        A call's own options, as a session cell's: ``timeline`` (a path, or "on"/"cycles"; the
        session started with ``timeline=True``), ``logdir`` (a TensorBoard run folder for this
        call), ``mlflow`` (an MLflow run for it), ``stragglers``."""
        if not self._live.live:
            raise self._ended()
        asked = keywords(SESSION_RUN, locals())
        try:
            targets = parse_ranks(None, _listed(ranks), self._live.size)
            options = session_cell_options(self._live, asked, targets)
        except UsageError as err:
            raise ValueError(str(err)) from None
        try:
            value, _ = self._live.run(pack_function(main, kwargs), targets, options=options)
        except SessionEnded:  # idle= ended it as this call came: the call ran nowhere
            raise self._ended() from None
        return value

    def _ended(self) -> SessionEnded:
        return SessionEnded(f"the session ended ({self._live.ended_because}): start a new Session")

    def wait_ended(self, timeout: float) -> bool:
        """Whether the session ended (``idle=``, a lost rank, ``stop``) within ``timeout`` seconds."""
        return self._live.wait_ended(timeout)

    def status(self) -> str:
        """Ranks, hosts, pids, memory, CPU, and whether each is busy."""
        return status_text(self._live)

    def stacks(self) -> str:
        """Where each rank is now: its Python stack, ranks with the same stack shown once. Callable
        from any thread, also while a cell runs (a hung one, say)."""
        return stacks_text(self._live)

    def stop(self) -> list[str]:
        """End every rank and free its slot; what could not be stopped (normally nothing)."""
        return self._live.end()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def _listed(ranks: object) -> str | None:
    """``ranks=`` of ``Session.run`` (a list of rank numbers, or one) as ``parse_ranks`` reads it."""
    if ranks is None:
        return None
    chosen = [ranks] if isinstance(ranks, int) else ranks
    if isinstance(ranks, (bool, str)) or not isinstance(chosen, (list, tuple, set, range)):
        raise ValueError(f"ranks takes a list of rank numbers, e.g. ranks=[0, 2]; got {ranks!r}")
    if not chosen:
        raise ValueError("ranks=[] names no rank: leave ranks out to run on every rank")
    return ",".join(str(rank) for rank in chosen)
