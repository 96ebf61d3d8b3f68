"""``%%horovod``: parse the line, capture the cell, run it, hand back rank 0's value."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from hvd_magic.options import OPTIONS, OptionError, RunOptions, make_options
from hvd_magic.options.option import CELL, SESSION_CELL, START
from hvd_magic.options.parse import parse_timeout
from hvd_magic.options.run_options import keywords
from hvd_magic.run.history import HISTORY
from hvd_magic.run.packing import Packed, pack_cell
from hvd_magic.run.supervisor import run_on_ranks
from hvd_magic.session import commands as sessions

__all__ = ["HorovodMagics", "check_given", "normalize_line", "usage"]

NAMES = [entry.name for entry in OPTIONS]
VERBS = f"{sessions.VERBS}|runs|last"
# A cell's run: packed cell -> (value, rank 0's returned names); fills {rank: host}.
CellRun = Callable[[Packed, dict[int, str]], tuple[Any, dict[str, Any]]]


def normalize_line(line: str) -> list[str]:
    """``np=4 env=A=1`` and ``-np 4`` become argparse's ``--np=4 --env=A=1``/``--np 4``: the
    line's words as the shell splits them (quotes for spaces, ``~`` and ``*`` kept as written),
    handed to argparse as they are."""
    try:
        words = shlex.split(line)
    except ValueError as err:  # an unclosed quote
        raise UsageError(f"the %%horovod line is not well quoted ({err}): {line}") from None
    tokens: list[str] = []
    seen: set[str] = set()
    for token in words:
        key, sep, _ = token.partition("=")
        if token == "-np":
            token = key = "--np"
        elif tokens and tokens[-1].startswith("--") and tokens[-1][2:] in NAMES and not key.startswith("-"):
            pass  # the value of ``--env A=1``, written apart from its option
        elif sep and not key.startswith("-"):
            if key not in NAMES:
                raise UsageError(f"unknown option {key!r}; the options are: {', '.join(NAMES)}")
            token, key = f"--{token}", f"--{key}"
        if key.startswith("--"):
            if key in seen:
                raise UsageError(f"option {key[2:]!r} is given twice; give it once: {line}")
            seen.add(key)
        tokens.append(token)
    return tokens


def usage() -> str:
    """The magic's one-line usage, from the table (a cell's options; the rest in ``%%horovod?``)."""
    shown = " ".join(
        f"[{entry.name}={entry.value}]" for entry in OPTIONS if CELL in entry.where and entry.name != "np"
    )
    return (
        f"usage: %%horovod np=N {shown}\n"
        "np=-N runs N ranks on this machine, np=N on Spark; %%horovod? shows the full help."
    )


def check_given(place: str, given: Mapping[str, object]) -> None:
    """Refuse (``OptionError``, saying why) the first option in ``given`` (by name, None for
    not given) that does not apply at ``place``."""
    for entry in OPTIONS:
        if given.get(entry.name) is not None and (why := entry.refusal(place)):
            raise OptionError(why)


def with_options(method: Callable[..., Any]) -> Callable[..., Any]:
    """The magic's argparse parser (and ``%%horovod?``), one argument an entry of ``OPTIONS``."""
    for entry in reversed(OPTIONS):  # IPython adds them last first
        escaped = entry.help.replace("%", "%%")  # argparse formats help with %
        metavar = None if entry.choices else entry.value
        method = argument(
            f"--{entry.name}", dest=entry.key, choices=entry.choices or None, metavar=metavar, help=escaped
        )(method)
    return magic_arguments()(method)  # type: ignore[no-any-return]


def given(args: Any) -> dict[str, Any]:
    """The options on the line, by name (None: not given)."""
    return {entry.name: getattr(args, entry.key) for entry in OPTIONS}


@magics_class
class HorovodMagics(Magics):
    @with_options
    @line_cell_magic
    def horovod(self, line: str, cell: str | None = None) -> Any:
        """Run the cell as a Horovod job; its last expression on rank 0 is the cell's value.

        Example::

            %%horovod np=-2
            import horovod.torch as hvd
            hvd.init()
            hvd.rank()

        A live session keeps its ranks (and what cells define on them) across cells::

            %horovod start np=-2        # same options as a cell; Horovod is initialised once
            %%horovod                   # no np=: runs on the session's ranks
            %%horovod rank=0            # on rank 0 only (no collectives in such a cell)
            %%horovod timeline=on       # its own timeline (start ... timeline=yes); logdir=, mlflow=
            %horovod status             # ranks, hosts, pids, memory, CPU, busy or idle
            %horovod stacks             # where each rank is now: its Python stack
            %horovod debug              # pdb where the last cell failed (rank=N: that rank's)
            %horovod stop               # ends the ranks, frees their slots

        Every run is recorded in the kernel, whether or not a browser watched it::

            %horovod runs               # the last runs: when, on what, how each ended
            %horovod last               # the last run's final record; returns rank 0's value
            %horovod runs 3             # run 3's
        """
        if cell is None:
            return self._session_verb(line)
        args = self._parse(line)
        try:
            options, run = self._cold(args) if args.np is not None else self._on_session(args)
        except (UsageError, OptionError) as err:
            raise UsageError(f"{err}\n{usage()}") from None
        return self._run_cell(cell, options, run)

    def _parse(self, line: str) -> Any:
        try:
            magic: Any = self.horovod  # magic_arguments gave it its parser
            return magic.parser.parse_args(normalize_line(line))
        except UsageError as err:
            raise UsageError(f"{err}\n{usage()}") from None

    def _cold(self, args: Any) -> tuple[RunOptions, CellRun]:
        """A cell that is a job of its own."""
        check_given(CELL, given(args))
        options = self._options(args)
        live = sessions.current()
        if live is not None and live.live:
            options.notices.append(
                "a live session is running: np= makes this cell a job of its own, apart from the session "
                "(drop np= to run it on the session's ranks)"
            )
        return options, lambda packed, hosts: run_on_ranks(packed, options, hosts=hosts)

    def _on_session(self, args: Any) -> tuple[RunOptions, CellRun]:
        """A cell without np=: on the live session's ranks, in their namespaces."""
        if sessions.current() is None:
            raise UsageError(
                "np= is required, e.g. %%horovod np=-2 (ranks on this machine) or np=4 (Spark); or "
                "start a live session once with %horovod start np=N and run cells on it without np="
            )
        check_given(SESSION_CELL, given(args))
        return sessions.cell_run(vars(args))  # by keyword, as argparse's dests are

    def _options(self, args: Any) -> RunOptions:
        """A job's options (a cell's, or those the session starts with): the ``CELL`` ones."""
        values = keywords(CELL, vars(args)) | {"data": self._data(args.data)}
        return make_options(**values, data_name=args.data or "data")

    def _session_verb(self, line: str) -> Any:
        verb, _, rest = line.strip().partition(" ")
        if verb == "status":
            print(sessions.status_text(sessions.current()))
            return None
        if verb == "stacks":
            print(sessions.stacks_text(sessions.current()))
            return None
        if verb == "stop":
            print(sessions.stop())
            return None
        if verb == "debug":
            print(sessions.debug(rest) or "", end="")
            return None
        if verb in ("runs", "last"):
            return self._recorded(verb, rest.strip())
        if verb != "start":
            raise UsageError(f"usage: %horovod {VERBS} [options]; a cell: %%horovod np=N\n{usage()}")
        args = self._parse(rest)
        try:
            check_given(START, given(args))
            timeline, args.timeline = args.timeline, None  # at start: whether cells may record one
            options = self._options(args)
            idle = parse_timeout(args.idle)
            ready = sessions.timeline_ready(timeline, options)
        except (UsageError, OptionError) as err:
            raise UsageError(f"{err}\n{usage()}") from None
        print(sessions.start(options, idle, ready), file=sys.stderr)
        return None

    def _recorded(self, verb: str, number: str) -> Any:
        """``%horovod runs``: the kernel's last runs; ``runs N``/``last``: one's record, and its value."""
        if verb == "runs" and not number:
            print(HISTORY.table())
            return None
        if verb == "last" and number or number and not number.isdigit():
            raise UsageError(
                f"usage: %horovod runs, %horovod runs N (N: a run's number), %horovod last; not {number!r}"
            )
        entry = HISTORY.get(int(number) if number else None)
        if entry is None:
            kept = ", ".join(str(e.number) for e in HISTORY.entries) or "none yet"
            raise UsageError(
                f"no run {number or 'yet'} in this kernel's record (kept: {kept}); %horovod runs lists them"
            )
        print(entry.record())
        return entry.value

    def _run_cell(self, cell: str, options: RunOptions, run: CellRun) -> Any:
        """Every cell, a job or on the session: capture it, run it, show its timeline, and
        hand back rank 0's value and names."""
        shell = self.shell
        assert shell is not None
        source = shell.transform_cell(cell)
        packed = pack_cell(source, shell.user_ns, set(shell.user_ns_hidden), options.return_names)
        hosts: dict[int, str] = {}
        try:
            value, returned = run(packed, hosts)
        finally:
            if options.timeline and os.path.exists(options.timeline):
                from hvd_magic.timeline.shown import show_run_timeline

                show_run_timeline(options.timeline, options.env, hosts)
        shell.user_ns.update(returned)
        return value

    def _data(self, name: str | None) -> Any:
        """The notebook variable ``data=`` names."""
        if name is None:
            return None
        namespace = self.shell.user_ns  # type: ignore[union-attr]
        if name not in namespace:
            raise UsageError(f"data={name}: the notebook has no variable {name!r}; name a DataFrame in it")
        return namespace[name]

    @line_magic
    def horovod_doctor(self, line: str) -> Any:
        """Check what a run needs, each failure with its fix: ``%horovod_doctor``.

        mpirun, Horovod and the frameworks it was built for, and the active SparkSession: its
        slots, GPUs, dynamic allocation, and (a small Spark job) the executors' Python and
        packages and whether they reach this notebook. Changes nothing.
        """
        from hvd_magic.doctor import doctor

        return doctor()

    @line_magic
    def horovod_timeline(self, line: str) -> None:
        """Show the analysis of a Horovod Timeline file: ``%horovod_timeline PATH``.

        Works on files from killed runs too (a truncated tail is dropped). For your own
        analysis: ``hvd_magic.timeline.read(PATH).to_pandas()``.
        """
        path = line.strip().strip("'\"")
        if not path:
            raise UsageError("usage: %horovod_timeline PATH (a Horovod Timeline JSON file)")
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file")
        from hvd_magic.timeline import TimelineError
        from hvd_magic.timeline.shown import show_timeline

        try:
            show_timeline(path)
        except TimelineError as err:
            raise UsageError(str(err)) from None
