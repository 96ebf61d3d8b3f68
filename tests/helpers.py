"""What many tests need: the run's processes (left over, anywhere), waiting on ranks that
marked themselves started, cells that wait, and forged keys."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import psutil

from hvd_magic.hub import RunKeys
from hvd_magic.protocol import Message

# A run's processes: Open MPI's launcher and daemons by their program, ours by their module.
RUN_PROGRAMS = ("mpirun", "orted")
RUN_MODULES = ("hvd_magic.rank.worker", "hvd_magic.launch.task.agent")
STAND_IN = os.path.join("hvd_magic", "warm", "stand_in.py")  # a warm rank's stand-in, run by path
FORK_SERVER = "hvd_magic.warm.fork_server"  # a warm rank's server, and the waiters it forks
SUITE_VARIABLE = "HVD_MAGIC_TEST_SUITE"  # every process a suite starts inherits its mark (conftest)
LAUNCHERS_RANK = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "RANK")  # what a launcher sets a rank it starts
ORPHANED = "an orphaned warm rank"  # _suite_mark's: a warm rank whose waiter is gone, no suite's to tell
SLEEP_FOREVER = "while True:\n    time.sleep(0.1)\n"
WAIT_FOR_GO = (  # a cell's ranks wait (up to 120 s) for the test to make ``go`` in the folder ``d``
    "for _ in range(1200):\n    if (d / 'go').exists(): break\n    time.sleep(0.1)\n"
)
ALLREDUCE_FOREVER = "for _ in range(3000):\n    hvd.allreduce(torch.tensor([1.0]))\n    time.sleep(0.1)\n"
# A cell's ``rank`` and ``size`` as the launchers set them (hvd_magic.protocol.env, loaded in every
# rank): no framework imported for them. The cell imports os.
RANK_FROM_ENV = (
    "from hvd_magic.protocol.env import RANK_VARIABLES, rank_from_env\n"
    "assert any(v[0] in os.environ for v in RANK_VARIABLES), 'no launcher rank variable in this rank'\n"
    "rank, _, size = rank_from_env()\n"
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_files(paths: list[Path], timeout: float, cancelled: threading.Event | None = None) -> bool:
    """True once every path exists; False after ``timeout`` seconds or once ``cancelled`` is set."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline or (cancelled is not None and cancelled.is_set()):
            return False
        time.sleep(0.05)
    return True


def placed_ranks(text: str, when: str) -> dict[int, str]:
    """From a run's "Where each rank was {when}:" paragraph: each rank named there, with its
    group's headline ("in line 7 of the cell", "in init (basics.py:105), from line 4 ...")."""
    paragraph = text.split(f"Where each rank was {when}:\n", 1)[1]
    placed = {}
    for line in paragraph.splitlines():
        found = re.match(r"ranks? ([\d, ]+)(?: on [^:]+)?: (.*)$", line)
        if found:
            placed |= {int(rank): found[2] for rank in found[1].split(", ")}
    return placed


def wait_for_ranks(
    directory: Path, ranks: int, timeout: float = 120, cancelled: threading.Event | None = None
) -> bool:
    """True once ranks 0..ranks-1 of a ``waiting_cell`` marked themselves started."""
    return wait_for_files([directory / f"started-{rank}" for rank in range(ranks)], timeout, cancelled)


def waiting_cell(
    directory: Path, ignore_signals: bool = False, wait: str = SLEEP_FOREVER, horovod: bool = False
) -> str:
    """A cell whose ranks mark themselves started (``started-RANK`` in ``directory``), then run
    ``wait``. With ``horovod`` they import ``horovod.torch`` and ``torch`` and init Horovod first
    (``wait`` may then use ``hvd`` and ``torch``, as ALLREDUCE_FOREVER does); without, they
    import no framework (seconds of CPU per rank) and take their rank from the launcher's
    environment."""
    if ("hvd." in wait or "torch." in wait) and not horovod:
        raise ValueError("this wait uses Horovod: give horovod=True")
    cell = "import os, signal, time, pathlib\n"
    if horovod:
        cell += "import horovod.torch as hvd, torch\n"
    if ignore_signals:
        cell += (
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        )
    cell += "hvd.init()\nrank = hvd.rank()\n" if horovod else RANK_FROM_ENV
    return cell + f"pathlib.Path({str(directory)!r}, f'started-{{rank}}').touch()\n" + wait


class _TestEnd:
    """A test's end: actions waiting for its ranks give up, and none acts after."""

    def __init__(self, ended: bool = False) -> None:
        self.lock = threading.Lock()
        self.ended = threading.Event()
        if ended:
            self.ended.set()


_current_test = [_TestEnd(ended=True)]  # the running test's; an ended one between tests


def start_of_test() -> None:
    _current_test[0] = _TestEnd()


def end_of_test() -> None:
    """conftest calls this after each test: actions still waiting for its ranks give up, and
    one under way finishes (a stop it sends now is dropped: ``sigint_in_tests``)."""
    test = _current_test[0]
    test.ended.set()
    with test.lock:
        pass


def sigint_in_tests(signum: int, frame: object) -> None:
    """SIGINT, the notebook's stop button, in the suite: a KeyboardInterrupt while a test runs
    (a run supervising takes it with a handler of its own); dropped between tests, where it can
    only be a stop meant for a test that ended (pytest would end the whole session on it)."""
    if not _current_test[0].ended.is_set():
        raise KeyboardInterrupt


def when_started(directory: Path, ranks: int, action: Callable[[], object]) -> threading.Thread:
    """Run ``action`` on a thread once the ranks of a ``waiting_cell`` started; never if they did
    not (within the wait's bound, or before the test ended): an interrupt or a kill meant for
    this test's run must not land in the next test's."""
    test = _current_test[0]

    def wait_then_act() -> None:
        if wait_for_ranks(directory, ranks, cancelled=test.ended):
            with test.lock:
                if not test.ended.is_set():
                    action()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone, or a zombie, since it was listed
        return ""


def is_run_process(argv: list[str]) -> bool:
    """A rank (or a warm rank's stand-in), an exec agent, mpirun or an orted: by program name,
    script or ``-m`` module, not by a substring (a shell whose command line names
    tests/test_launch_mpirun.py is none of them)."""
    if not argv:
        return False
    if os.path.basename(argv[0]) in RUN_PROGRAMS:
        return True
    if any(part.endswith(STAND_IN) for part in argv[1:3]):  # python [-I] .../stand_in.py: a stand-in
        return True
    return any(argv[i] == "-m" and argv[i + 1] in RUN_MODULES for i in range(len(argv) - 1))


def is_rank(argv: list[str]) -> bool:
    """A rank, started or forked warm (whose command line, written over its fork server's longer
    one, ends in empty arguments)."""
    return [part for part in argv if part][1:] == ["-m", "hvd_magic.rank.worker"]


def _run_process(process: psutil.Process) -> bool:
    try:
        return is_run_process(process.cmdline())
    except psutil.Error:
        return False


# How long a run's process found on its way out may take to end: a rank whose end its launcher
# has seen may still be exiting (its atexit work, coverage.py's data file under scripts/coverage.sh).
ENDING_SECONDS = 10.0


def _left_after(seconds: float, find: Callable[[], list[str]]) -> list[str]:
    """What ``find`` still finds after up to ``seconds``; [] as soon as it finds nothing."""
    deadline = time.monotonic() + seconds
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def leftover_processes(root: psutil.Process | None = None, settle: float = ENDING_SECONDS) -> list[str]:
    """Processes of a run below ``root`` (by default this process) that must not be left behind:
    those still running ``settle`` seconds on (0: those running now, as a run's own are). An
    ended one that is not reaped yet (a zombie) has no command line left: it is not counted."""

    def running() -> list[str]:
        below = below_with_warm_ranks(root or psutil.Process())
        return [f"{process.pid}: {_cmdline(process)[:200]}" for process in below if _run_process(process)]

    return _left_after(settle, running)


def single_process_env() -> dict[str, str]:
    """The environment of a one-process Horovod started without mpirun: an Open MPI singleton
    that starts no ``orted`` of its own (which would outlive it for a moment, a leftover for the
    next test's check)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "HOROVOD_"))}
    return env | {"OMPI_MCA_ess_singleton_isolated": "1"}


def run_processes_anywhere() -> list[str]:
    """Rank-side processes anywhere on the machine (on Spark they are the executors' children),
    except those of another test suite running beside this one (a process carrying another
    suite's mark in its environment; one without any mark counts)."""
    found = []
    for process in psutil.process_iter():
        if is_left_running(process):
            found.append(f"{process.pid}: {_cmdline(process)[:200]}{_whence(process)}")
    return found


# How long a process caught changing (between fork and exec, or with its memory released on its way
# out) is looked at again before it counts as it last looked.
SETTLING_SECONDS = 5.0


def is_left_running(process: psutil.Process, seconds: float = SETTLING_SECONDS) -> bool:
    """A run's process of this suite, not ended (what ``run_processes_anywhere`` lists). Its
    mark is read from its environment, which is only its own while its command line stays the
    same around the reading: a child of another suite's mpirun caught in its exec, or one whose
    memory is gone as it exits, shows an empty environment (no mark, which counts) for a moment.
    Such a one is looked at again until it stands still (then the look holds) or has gone (it
    is not counted)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            argv = process.cmdline()
            if not is_run_process(argv):
                return False
            another = _of_another_suite(process)
            still = process.cmdline() == argv
        except psutil.Error:  # gone, or a zombie, since it was listed
            return False
        if still or time.monotonic() > deadline:
            return not another and not _ended(process)
        time.sleep(0.02)


def _ended(process: psutil.Process) -> bool:
    """Exited, and only waiting for its parent to reap it (or gone since): nothing is left of it."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _whence(process: psutil.Process) -> str:
    """' (12 s old, rank 2 of run X, parent 41: python -m pyspark.daemon)': what a leftover is."""
    try:
        env, age = process.environ(), time.time() - process.create_time()
        parent = process.parent()
        above = f"parent {parent.pid}: {_cmdline(parent)[:80]}" if parent else "no parent"
    except psutil.Error:
        return ""
    rank = env.get("HOROVOD_RANK") or env.get("RANK") or env.get("OMPI_COMM_WORLD_RANK") or "?"
    return f" ({age:.0f} s old, rank {rank}, {above})"


def _of_another_suite(process: psutil.Process) -> bool:
    try:
        mark = _suite_mark(process)
    except (psutil.Error, ValueError):
        return False
    return mark is not None and mark != os.environ.get(SUITE_VARIABLE)


def _suite_mark(process: psutil.Process) -> str | None:
    """The mark of the suite whose run ``process`` is of. A rank started as itself has it in its
    own environment (beside its launcher's rank variables). A warm rank (and its fork server)
    shows the environment its server's preloader was started with, by whichever suite's kernel
    started it: the mark of the server's keeper (``--keeper PID``) counts, else that of the
    first process above that is neither a rank nor a fork server. A warm rank whose waiter is
    gone (its parent is init) is no one's to tell: it ends with its stand-in (``ORPHANED``)."""
    current: psutil.Process | None = process
    while current is not None:
        argv = current.cmdline()
        if FORK_SERVER in argv and "--keeper" in argv:
            return psutil.Process(int(argv[argv.index("--keeper") + 1])).environ().get(SUITE_VARIABLE)
        environ = current.environ()
        started_as_itself = is_rank(argv) and any(name in environ for name in LAUNCHERS_RANK)
        if started_as_itself or (FORK_SERVER not in argv and not is_rank(argv)):
            return environ.get(SUITE_VARIABLE)
        rank, current = is_rank(argv), current.parent()
        if rank and current is not None and current.pid == 1:
            return ORPHANED
    return None


def gone_within(seconds: float) -> list[str]:
    """The run's processes still alive anywhere after up to ``seconds``; [] once all are gone."""
    return _left_after(seconds, run_processes_anywhere)


def fork_servers_of(keeper: int) -> list[psutil.Process]:
    """The fork servers ``keeper`` keeps: forked from a preloader and shown with ``--keeper PID``,
    or started as its children where there is no preloader (not what a server forked itself)."""
    found = []
    for process in psutil.process_iter():
        with suppress(psutil.Error):  # gone, or a zombie
            argv = " ".join(process.cmdline())
            kept = f"{FORK_SERVER} --keeper {keeper} " in argv or (
                FORK_SERVER in argv and process.ppid() == keeper
            )
            if kept and FORK_SERVER not in " ".join(process.parent().cmdline()):
                found.append(process)
    return found


def below_with_warm_ranks(root: psutil.Process) -> list[psutil.Process]:
    """What runs below ``root``, and what the fork servers it keeps forked (its warm ranks, which
    are not below it where their server was forked from a preloader)."""
    found = {process.pid: process for process in root.children(recursive=True)}
    for server in fork_servers_of(root.pid):
        with suppress(psutil.Error):
            found |= {process.pid: process for process in server.children(recursive=True)}
    return list(found.values())


def executor_processes() -> list[psutil.Process]:
    return [
        p for p in psutil.Process().children(recursive=True) if "CoarseGrainedExecutorBackend" in _cmdline(p)
    ]


def forged_token(server_public: bytes) -> str:
    """A client token for a server whose public key is known, with keys the server never issued."""
    forged = RunKeys.generate()
    return b",".join([server_public, forged.client_public, forged.client_secret]).decode()


class RecordingView:
    """A RunView that keeps what it was given (the engine's view interface, in memory)."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.notices: list[str] = []
        self.ticks = 0
        self.closed = False

    def notice(self, text: str) -> None:
        assert not self.closed, f"a notice after the view was closed is lost: {text}"
        self.notices.append(text)

    def message(self, message: Message) -> None:
        self.messages.append(message)

    def tick(self) -> None:
        self.ticks += 1

    def close(self) -> None:
        self.closed = True


def stopped_by_a_notice(marks: Path, then: str = "") -> str:
    """A cell whose first attempt trains (one step: +1 to w) until ``hvd_magic.stopping()`` says
    stop (a preemption notice), checkpoints there, waiting until it is kept, runs ``then`` on
    rank 0 and leaves; a later attempt resumes and trains 20 steps more. Rank ``r`` touches
    ``started-r`` in ``marks``. Its value: (w, the step each attempt started from)."""
    return f"""import os, pathlib, time, horovod.torch as hvd, torch, hvd_magic
hvd.init()
state = hvd_magic.resume() or {{"step": 0, "w": torch.zeros(1), "starts": []}}
w, starts = state["w"], state["starts"] + [state["step"]]
pathlib.Path({str(marks)!r}, f"started-{{hvd.rank()}}").touch()
end = state["step"] + 20 if state["step"] else 3000  # the first attempt: until the notice
for step in range(state["step"], end):
    w = w + hvd.allreduce(torch.ones(1), op=hvd.Average)  # one a step
    if hvd_magic.stopping():  # the only checkpoint: written where the notice found the ranks
        hvd_magic.checkpoint({{"step": step + 1, "w": w, "starts": starts}}, step=step + 1, wait=True)
        if hvd.rank() == 0:
            {then or "pass"}
        break
    time.sleep(0.02)
(w.item(), starts)
"""
