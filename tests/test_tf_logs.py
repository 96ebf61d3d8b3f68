"""TensorFlow's start-up log lines below ``TF_CPP_MIN_LOG_LEVEL`` leave a rank's stderr, whatever
the chunks it arrives in; every other byte stays."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hvd_magic.rank.tf_logs import TfLogFilter

PRE_INIT = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = b"I0000 00:00:1795603101.811660     605 port.cc:153] oneDNN custom operations are on.\n"
CPU_GUARD = b"I0000 00:00:1795603102.467951     605 cpu_feature_guard.cc:227] This TensorFlow binary\n"
TF_WARNING = b"W0000 00:00:1795603102.5 605 gpu_device.cc:2344] Cannot dlopen some GPU libraries.\n"
TF_ERROR = b"E1125 10:31:12.000001 77 cuda_dnn.cc:8310] Unable to register cuDNN factory\n"
USER = [
    b"epoch 1: loss 0.25\n",
    b"Iteration 3\r",
    b"I think so\n",
    b"Traceback (most recent call last):\n",
    b"I0000 not a log line\n",
    b"WARNING: something of the user's\n",
    b"progress 50%",
]
LEVELS = {ONEDNN: 0, CPU_GUARD: 0, TF_WARNING: 1, TF_ERROR: 2}


def kept(stream: bytes, level: int) -> bytes:
    """The model: the stream's lines (a line ends at a newline), those TensorFlow logged below
    ``level`` taken out."""
    *lines, tail = stream.split(b"\n")
    dropped = {PRE_INIT} | {line for line, severity in LEVELS.items() if severity < level}
    return b"".join(line + b"\n" for line in lines if level == 0 or line + b"\n" not in dropped) + tail


@given(
    st.lists(st.sampled_from([PRE_INIT, ONEDNN, CPU_GUARD, TF_WARNING, TF_ERROR, *USER]), max_size=12),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    st.integers(min_value=0, max_value=3),
)
def test_lines_below_the_level_go_and_everything_else_stays_whatever_the_chunks(lines, cuts, level):
    # A user's partial line (a progress line) is passed on at once, and what the next write brings
    # is judged as a line of its own (the test below): so here a partial line comes last only.
    stream = b"".join(
        line if i == len(lines) - 1 else line.rstrip(b"\n") + b"\n" for i, line in enumerate(lines)
    )
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    log = TfLogFilter(level)
    out = b"".join(log.feed(stream[a:b]) for a, b in zip(points, points[1:], strict=False)) + log.flush()
    assert out == kept(stream, level)


def test_a_line_that_cannot_be_tensorflows_is_passed_on_at_once():
    log = TfLogFilter(1)
    assert log.feed(b"progress 10%\r") == b"progress 10%\r"
    assert log.feed(b"Iter") == b"Iter"  # a progress line is not held back for its newline
    assert log.feed(b"I0000 00:00:1.5 7 port.cc:1] oneDNN") == b""  # TF's INFO: held, to be dropped
    assert log.feed(b" custom operations\nnext\n") == b"next\n"
