"""A debugger across ranks: ``breakpoint()``, pdb and ``input()`` in a rank, asked at the notebook.

Real ranks; the person at the notebook is played by ``builtins.input`` (what the kernel's input
box is, while a cell runs), or, in the kernel tests, by jupyter_client answering the kernel's
stdin requests as a notebook does."""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator

import pytest
from IPython.core.error import UsageError
from jupyter_client.manager import start_new_kernel

from hvd_magic import RankFailedError

from .helpers import leftover_processes
from .kernels import Kernel

BREAK_ON_RANK_1 = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = 10 * (dist.get_rank() + 1)
if dist.get_rank() == 1:
    breakpoint()
    y = x + 1
t = torch.tensor([float(x)])
dist.all_reduce(t)
t.item()
"""


class Person:
    """Types ``answers`` in turn at the prompts it is shown, and keeps each prompt."""

    def __init__(self, *answers: str) -> None:
        self.answers, self.prompts = list(answers), list[str]()

    def __call__(self, prompt: str = "") -> str:
        self.prompts.append(prompt)
        if not self.answers:
            raise AssertionError(f"asked once more than expected: {prompt!r}")
        return self.answers.pop(0)


@pytest.fixture
def person(monkeypatch: pytest.MonkeyPatch) -> Iterator[Person]:
    typed = Person()
    monkeypatch.setattr(builtins, "input", typed)
    yield typed


def test_a_breakpoint_in_rank_1_is_a_pdb_prompt_at_the_notebook(ip, person, capsys):
    person.answers = ["p x", "l", "n", "p y", "c"]
    value = ip.run_cell_magic("horovod", "np=-2 backend=torch", BREAK_ON_RANK_1)
    assert value == 30.0  # continued: the cell ends as without the breakpoint
    assert len(person.prompts) == 5 and all(
        re.fullmatch(r"rank 1 on \S+ \(Pdb\) ", p) for p in person.prompts
    )
    said = capsys.readouterr().out
    assert "-> y = x + 1" in said  # where it stopped, before the first prompt
    assert "\n20\n" in f"\n{said}"  # p x: rank 1's own value
    assert "  5  \t    breakpoint()" in said and "  6  ->\t    y = x + 1" in said  # l: the cell's source
    assert "-> t = torch.tensor([float(x)])" in said  # n moved a line
    assert "\n21\n" in said  # p y


def test_quit_in_the_debugger_ends_the_cell_with_a_clear_error(ip, person):
    person.answers = ["q"]
    with pytest.raises(
        RankFailedError, match=r"rank 1 on \S+ failed: BdbQuit: quit in the debugger \(q\)"
    ) as info:
        ip.run_cell_magic("horovod", "np=-2 backend=torch", BREAK_ON_RANK_1)
    assert "bdb.py" not in str(info.value)  # the cell's frames, not the debugger's
    assert leftover_processes() == []


TWO_AT_A_BREAKPOINT = """import horovod.torch as hvd, torch
hvd.init()
x = hvd.rank() + 1
breakpoint()
hvd.allreduce(torch.tensor([float(x)]), op=hvd.Sum).item()
"""


def test_ranks_at_a_breakpoint_are_asked_one_at_a_time_in_rank_order(ip, person, capsys):
    person.answers = ["p x * 100", "c", "p x * 100", "c"]
    value = ip.run_cell_magic("horovod", "np=-2", TWO_AT_A_BREAKPOINT)
    assert value == 3.0
    ranks = [int(prompt.split()[1]) for prompt in person.prompts]
    assert ranks == [0, 0, 1, 1] or ranks == [1, 1, 0, 0]  # whoever came first, then the other, whole
    said = capsys.readouterr().out
    assert said.index("\n100\n" if ranks[0] == 0 else "\n200\n") < said.index(
        "\n200\n" if ranks[0] == 0 else "\n100\n"
    )


def test_a_timeout_shorter_than_the_time_in_the_debugger_does_not_end_the_run(ip, monkeypatch):
    import time

    def slow_person(prompt: str = "") -> str:
        time.sleep(12)  # the person reads the code: longer than timeout=10
        return "c"

    # (timeout= counts from the ranks' start: on a loaded machine, torch's rendezvous in the cell
    # was silent for more than 3 s)
    monkeypatch.setattr(builtins, "input", slow_person)
    assert ip.run_cell_magic("horovod", "np=-2 backend=torch timeout=10", BREAK_ON_RANK_1) == 30.0


def test_input_in_a_rank_is_asked_at_the_notebook_labelled(ip, person):
    person.answers = ["blue"]
    cell = "import horovod.torch as hvd\nhvd.init()\nanswer = input('colour? ') if hvd.rank() == 1 else ''\n"
    ip.run_cell_magic(
        "horovod", "np=-2 return=answer", cell + "answer = hvd.broadcast_object(answer, root_rank=1)\n"
    )
    assert ip.user_ns["answer"] == "blue"
    assert re.fullmatch(r"rank 1 on \S+ colour\? ", person.prompts[0])


def test_the_chosen_ranks_breakpoints_stop_and_the_others_pass(ip, person, monkeypatch):
    monkeypatch.setenv("HVD_MAGIC_BREAKPOINT_RANKS", "1")
    person.answers = ["c"]
    assert ip.run_cell_magic("horovod", "np=-2", TWO_AT_A_BREAKPOINT) == 3.0
    assert [int(prompt.split()[1]) for prompt in person.prompts] == [1]
    person.answers, person.prompts = ["c"], []  # one cell's own choice, in its env=
    assert (
        ip.run_cell_magic("horovod", "np=-2 env=HVD_MAGIC_BREAKPOINT_RANKS=0:5", TWO_AT_A_BREAKPOINT) == 3.0
    )
    assert [int(prompt.split()[1]) for prompt in person.prompts] == [0]


def test_without_a_stdin_a_breakpoint_is_passed_and_said_once(ip, monkeypatch, capsys):
    def no_stdin(prompt: str = "") -> str:
        raise OSError("pytest: reading from stdin while output is captured!")

    monkeypatch.setattr(builtins, "input", no_stdin)
    cell = TWO_AT_A_BREAKPOINT.replace("breakpoint()", "breakpoint()\nbreakpoint()")
    assert ip.run_cell_magic("horovod", "np=-2", cell) == 3.0
    said = capsys.readouterr()
    assert "this notebook takes no input" in said.err + said.out
    assert (said.out + said.err).count("a breakpoint was passed") == 2  # each rank once, not per breakpoint


def test_a_kernels_stdin_request_answers_a_ranks_breakpoint(tmp_path):
    """The notebook's own input box: the kernel asks its frontend (here jupyter_client), labelled."""
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    kernel = Kernel(manager, client)
    asked: list[str] = []

    def answer(message: dict) -> None:
        asked.append(message["content"]["prompt"])
        client.input({"rank 1": "p x"}.get(asked[-1][:6], "c") if len(asked) == 1 else "c")

    try:
        assert kernel.run("%load_ext hvd_magic").status == "ok"
        reply = client.execute_interactive(
            "%%horovod np=-2 backend=torch\n" + BREAK_ON_RANK_1,
            timeout=240,
            allow_stdin=True,
            stdin_hook=answer,
            output_hook=lambda message: None,
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        assert len(asked) == 2 and asked[0].startswith("rank 1 on ") and asked[0].endswith("(Pdb) ")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_headless_kernel_passes_a_breakpoint_instead_of_hanging(tmp_path):
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    kernel = Kernel(manager, client)
    try:
        assert kernel.run("%load_ext hvd_magic").status == "ok"
        shown: list[str] = []
        reply = client.execute_interactive(
            "%%horovod np=-2 backend=torch\n" + BREAK_ON_RANK_1,
            timeout=240,
            allow_stdin=False,  # as nbconvert and papermill run a notebook
            output_hook=lambda message: shown.append(str(message["content"])),
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "takes no input" in "".join(shown) and "30.0" in "".join(shown)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


@pytest.fixture
def session(ip):
    yield ip
    from hvd_magic.session import commands

    commands.stop()


def test_a_breakpoint_in_a_live_sessions_cell_and_the_session_goes_on(session, person, capsys):
    session.run_line_magic("horovod", "start np=-2 backend=torch")
    person.answers = ["p x", "c"]
    cell = "x = 10 * (dist.get_rank() + 1)\nif dist.get_rank() == 1:\n    breakpoint()\nx\n"
    assert session.run_cell_magic("horovod", "", cell) == 10
    assert "\n20\n" in capsys.readouterr().out and len(person.prompts) == 2
    person.answers = ["q"]
    with pytest.raises(RankFailedError, match="quit in the debugger"):
        session.run_cell_magic("horovod", "", cell)
    assert session.run_cell_magic("horovod", "", "x + 1") == 11  # the ranks were in step: usable


FAILING = """secret = 6 * (dist.get_rank() + 1)
def check(value):
    limit = value - 1
    if dist.get_rank() == 1:
        raise ValueError(f"{value} is over {limit}")
check(secret)
"""


def test_post_mortem_opens_pdb_where_the_failed_rank_raised(session, person, capsys):
    session.run_line_magic("horovod", "start np=-2 backend=torch")
    with pytest.raises(UsageError, match="did not fail: there is nothing to debug"):
        session.run_line_magic("horovod", "debug")
    with pytest.raises(RankFailedError, match="ValueError: 12 is over 11"):
        session.run_cell_magic("horovod", "", FAILING)
    capsys.readouterr()
    person.answers = ["p limit, value", "u", "p secret", "q"]
    session.run_line_magic("horovod", "debug")  # the rank whose error ended the cell: rank 1
    said = capsys.readouterr().out
    assert all(prompt.startswith("rank 1 on ") for prompt in person.prompts)
    assert "ValueError: 12 is over 11" in said and "(11, 12)" in said and "\n12\n" in said
    person.answers = ["p secret", "q"]  # again: the failure is kept until the next cell
    session.run_line_magic("horovod", "debug rank=1")
    assert "\n12\n" in capsys.readouterr().out
    session.run_line_magic("horovod", "debug rank=0")  # rank 0 did not fail
    assert "rank 0: its last cell did not fail here" in capsys.readouterr().out
    session.run_cell_magic("horovod", "", "secret")
    with pytest.raises(UsageError, match="nothing to debug"):
        session.run_line_magic("horovod", "debug")
    with pytest.raises(UsageError, match=r"usage: %horovod debug \[rank=N\]"):
        session.run_line_magic("horovod", "debug rank=one")
