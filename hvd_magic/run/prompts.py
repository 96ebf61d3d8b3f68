"""A rank's questions asked at the notebook: ``input()`` and pdb in a rank (``rank.debugger``).

Each ``Prompt`` is asked with the notebook's own input box (the kernel's stdin request, as for
``input()`` in the kernel; a terminal's line in terminal IPython), labelled "rank 1 on host-a",
and what was typed goes back as ``Typed``. One rank in the debugger at a time: while one is,
other ranks' prompts wait, and the lowest rank's comes next once it continues, quits or ends.
Where the notebook takes no input (a headless run), nothing is asked again: each rank is told
so and goes on. The run's loop asks: while a person types, no time limit runs.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable

from hvd_magic.hub import Hub
from hvd_magic.protocol import DebuggerLeft, Exit, Message, Prompt, RankError, Typed
from hvd_magic.run.views import RunView

__all__ = ["RankPrompts"]


def _ask(prompt: str) -> str:
    return builtins.input(prompt)  # looked up at each call: the kernel's while a cell runs


class RankPrompts:
    """Answers the ranks' prompts of one run, from the run's loop (``take`` each message)."""

    def __init__(
        self,
        hub: Hub,
        view: RunView,
        hosts: dict[int, str],
        ask: Callable[[str], str] = _ask,
        say: Callable[[str], None] = print,
    ) -> None:
        self.hub, self.view, self.hosts, self.ask, self.say = hub, view, hosts, ask, say
        self.debugging: int | None = None  # the rank in the debugger
        self.waiting: dict[int, Message] = {}  # other ranks' prompts, until it leaves
        self.closed = False  # the notebook takes no input

    def take(self, message: Message) -> bool:
        """Whether ``message`` was a rank's question or its leaving the debugger (the run's
        record and view need not see it). A person may have been asked meanwhile."""
        record = message.record
        if isinstance(record, Prompt):
            if self.debugging not in (None, message.rank):
                self.waiting[message.rank] = message
            else:
                self._answer(message)
            return True
        if isinstance(record, DebuggerLeft) or (
            isinstance(record, (Exit, RankError)) and message.rank == self.debugging
        ):
            if isinstance(record, DebuggerLeft) and record.text.strip():
                self.say(record.text.rstrip("\n"))
            self.debugging = None
            if self.waiting:
                self._answer(self.waiting.pop(min(self.waiting)))
            return isinstance(record, DebuggerLeft)
        return False

    def _answer(self, message: Message) -> None:
        record = message.record
        assert isinstance(record, Prompt)
        rank, host = message.rank, self.hosts.get(message.rank, "?")
        shown, _, prompt = record.text.rpartition("\n")
        if self.closed:
            self.hub.send_to(message.identity, Typed(record.id, closed=True))
            return
        if record.debugger and self.debugging != rank:
            self.debugging = rank
            self.view.notice(f"hvd_magic: rank {rank} on {host} is in the debugger")
        if shown:
            self.say(shown)
        try:
            line = self.ask(f"rank {rank} on {host} {prompt}")
        except (EOFError, NotImplementedError, OSError):  # no stdin (IPython's StdinNotImplementedError)
            self.closed = True
            self.view.notice("hvd_magic: the ranks' prompts go unanswered: this notebook takes no input")
            self.hub.send_to(message.identity, Typed(record.id, closed=True))
            return
        self.hub.send_to(message.identity, Typed(record.id, line))
