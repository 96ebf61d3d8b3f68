"""The console view: rank output tagged line by line, streams kept apart, characters whole."""

from __future__ import annotations

from hvd_magic.protocol import Exit, Log, Message
from hvd_magic.run.views import ConsoleView, make_view


def log(rank: int, data: bytes, stream: str = "stdout") -> Message:
    return Message(Log(stream), rank, data)


def test_no_line_mixes_two_ranks_even_when_lines_arrive_in_pieces(capsys):
    view = ConsoleView()
    view.message(log(0, b"epoch 1 "))
    view.message(log(1, b"hello\nwor"))
    view.message(log(0, b"done\n"))
    view.message(log(1, b"ld\n"))
    view.message(Message(Exit(0), 1))  # not output: ignored
    view.close()
    assert capsys.readouterr().out == "[0] epoch 1 \n[1] hello\n[1] wor\n[0] done\n[1] ld\n"


def test_stderr_goes_to_stderr_and_an_open_line_is_closed_at_the_end(capsys):
    view = ConsoleView()
    view.message(log(2, b"warning: slow", "stderr"))
    view.notice("a notice")
    view.close()
    packed = capsys.readouterr()
    assert packed.out == "" and packed.err == "[2] warning: slow\na notice\n"


def test_a_character_split_across_chunks_is_printed_whole(capsys):
    view = ConsoleView()
    data = "loss ↓\n".encode()
    view.message(log(0, data[:6]))
    view.message(log(0, data[6:]))
    assert capsys.readouterr().out == "[0] loss ↓\n"


def test_outside_a_jupyter_kernel_the_view_is_text():
    assert isinstance(make_view(2), ConsoleView)
