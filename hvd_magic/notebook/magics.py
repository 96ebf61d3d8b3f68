"""``%%horovod``: parse the line, capture the cell, run it, hand back rank 0's value."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from hvd_magic.options import OptionError, RunOptions, make_options, parse_timeout
from hvd_magic.run.capture import capture_cell
from hvd_magic.run.supervisor import execute
from hvd_magic.session import commands as sessions

__all__ = ["HorovodMagics", "normalize_line"]

OPTIONS = (
    "np",
    "launcher",
    "backend",
    "env",
    "return",
    "timeout",
    "timeline",
    "data",
    "remainder",
    "oversubscribe",
    "rank",
    "ranks",
    "idle",
    "retries",
    "checkpoint_dir",
    "logdir",
    "mlflow",
    "stragglers",
)
USAGE = (
    "usage: %%horovod np=N [launcher=mpi|gloo | backend=torch] [env=K=V,...] [return=a,b] [timeout=SECONDS] "
    "[timeline=on|cycles|PATH] [data=DATAFRAME [remainder=drop|keep]] [oversubscribe=yes] [logdir=DIR] "
    "[mlflow=yes|no] [stragglers=0.7/10|off]\n"
    "np=-N runs N ranks on this machine, np=N on Spark; %%horovod? shows the full help."
)


def normalize_line(line: str) -> str:
    """``np=4 env=A=1`` and ``-np 4`` become argparse's ``--np=4 --env=A=1``/``--np 4``."""
    tokens = []
    try:
        words = shlex.split(line)
    except ValueError as err:  # an unclosed quote
        raise UsageError(f"the %%horovod line is not well quoted ({err}): {line}") from None
    seen: set[str] = set()
    for token in words:
        key, sep, _ = token.partition("=")
        if token == "-np":
            token = key = "--np"
        elif sep and not key.startswith("-"):
            if key not in OPTIONS:
                raise UsageError(f"unknown option {key!r}; the options are: {', '.join(OPTIONS)}")
            token, key = f"--{token}", f"--{key}"
        if key.startswith("--"):
            if key in seen:
                raise UsageError(f"option {key[2:]!r} is given twice; give it once: {line}")
            seen.add(key)
        tokens.append(shlex.quote(token))
    return " ".join(tokens)


@magics_class
class HorovodMagics(Magics):
    @magic_arguments()
    @argument(
        "--np",
        help="number of ranks: -N runs N ranks on this machine, N on Spark; without it, the cell runs on "
        "the live session (%%horovod start np=N)",
    )
    @argument("--launcher", choices=["mpi", "gloo"], help="mpi (default when mpirun exists) or gloo")
    @argument(
        "--backend", choices=["horovod", "torch"], help="horovod (default) or torch: torch.distributed ranks"
    )
    @argument("--env", help="extra environment for the ranks: KEY=VALUE,KEY2=VALUE2")
    @argument("--return", dest="return_names", help="rank 0 variables to copy back: a,b")
    @argument("--timeout", help="end the run when no rank reports anything for this many seconds")
    @argument(
        "--timeline",
        help="record a Horovod Timeline: on, cycles (mark cycles) or a file path; %%horovod start "
        "timeline=yes: the live session's cells may record theirs",
    )
    @argument("--data", help="a DataFrame of the notebook: each rank reads its shard with hvd_magic.shard()")
    @argument(
        "--remainder", choices=["drop", "keep"], help="rows that do not split evenly: drop (default), keep"
    )
    @argument(
        "--oversubscribe",
        choices=["yes", "no"],
        help="np=-N: allow more than 4 local ranks a CPU core (refused otherwise, as a likely typo)",
    )
    @argument("--retries", help="start again (from the last checkpoint) up to N times after a lost rank")
    @argument("--checkpoint_dir", help="where hvd_magic.checkpoint() keeps them: a folder or fsspec URL")
    @argument("--logdir", help="write the reported metrics as TensorBoard event files: a run's folder in DIR")
    @argument(
        "--mlflow",
        choices=["yes", "no"],
        help="log to MLflow: yes starts an MLflow run if none is active; default: log when one is active",
    )
    @argument(
        "--stragglers",
        help="name a rank whose steps/s stays below FRACTION of the median for SECONDS: FRACTION/SECONDS "
        "(default 0.7/10, also 70%%/10s), or off",
    )
    @argument("--rank", help="live session: run the cell on this rank only (it must not call collectives)")
    @argument("--ranks", help="live session: run the cell on these ranks only: 0,2")
    @argument("--idle", help="%%horovod start: end the session after this many seconds without a cell")
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
            %horovod stop               # ends the ranks, frees their slots
        """
        if cell is None:
            return self._session_verb(line)
        try:
            args = parse_argstring(self.horovod, normalize_line(line))
        except UsageError as err:
            raise UsageError(f"{err}\n{USAGE}") from None
        if args.np is None:
            if sessions.current() is None:
                raise UsageError(
                    "np= is required, e.g. %%horovod np=-2 (ranks on this machine) or np=4 (Spark); or "
                    "start a live session once with %horovod start np=N and run cells on it without "
                    f"np=\n{USAGE}"
                )
            return sessions.run_cell(self.shell, args, cell)
        if args.rank is not None or args.ranks is not None or args.idle is not None:
            raise UsageError("rank=, ranks= and idle= are for a live session (%horovod start np=N)")
        live = sessions.current()
        try:
            options = self._options(args)
        except (UsageError, OptionError) as err:
            raise UsageError(f"{err}\n{USAGE}") from None
        if live is not None and live.live:
            options.notices.append(
                "a live session is running: np= makes this cell a job of its own, apart from the session "
                "(drop np= to run it on the session's ranks)"
            )
        return self._cold(options, cell)

    def _options(self, args: Any) -> RunOptions:
        if args.np is None:
            raise UsageError("np= is required")
        return make_options(
            args.np,
            args.launcher,
            args.env,
            args.return_names,
            args.timeout,
            args.timeline,
            data=self._data(args.data),
            data_name=args.data or "data",
            remainder=args.remainder,
            backend=args.backend,
            oversubscribe=args.oversubscribe,
            retries=args.retries,
            checkpoint_dir=args.checkpoint_dir,
            logdir=args.logdir,
            mlflow=args.mlflow,
            stragglers=args.stragglers,
        )

    def _session_verb(self, line: str) -> Any:
        verb, _, rest = line.strip().partition(" ")
        if verb == "status":
            print(sessions.status_text(sessions.current()))
            return None
        if verb == "stop":
            print(sessions.stop())
            return None
        if verb != "start":
            raise UsageError(f"usage: %horovod {sessions.VERBS} [options]; a cell: %%horovod np=N\n{USAGE}")
        try:
            args = parse_argstring(self.horovod, normalize_line(rest))
            timeline, args.timeline = args.timeline, None  # at start: whether cells may record one
            options = self._options(args)
            idle = parse_timeout(args.idle)
        except (UsageError, OptionError) as err:
            raise UsageError(f"{err}\n{USAGE}") from None
        if args.rank is not None or args.ranks is not None or args.return_names:
            raise UsageError("rank=, ranks= and return= are per cell, not for %horovod start")
        if args.logdir or args.mlflow:
            raise UsageError(
                "logdir= and mlflow= are for a job of its own or a session's cell (a run of its own each), "
                "not for %horovod start: give them on the %%horovod cells to log"
            )
        print(sessions.start(options, idle, sessions.timeline_ready(timeline, options)), file=sys.stderr)
        return None

    def _cold(self, options: RunOptions, cell: str) -> Any:
        source = self.shell.transform_cell(cell)  # type: ignore[union-attr]
        captured = capture_cell(
            source,
            self.shell.user_ns,  # type: ignore[union-attr]
            set(self.shell.user_ns_hidden),  # type: ignore[union-attr]
            options.return_names,
        )
        hosts: dict[int, str] = {}
        try:
            value, returned = execute(captured, options, hosts=hosts)
        finally:
            if options.timeline and os.path.exists(options.timeline):
                from hvd_magic.timeline.shown import show_run_timeline

                show_run_timeline(options.timeline, options.env, hosts)
        self.shell.user_ns.update(returned)  # type: ignore[union-attr]
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
