"""``min_np=``: each attempt's size, decided from the slots a cluster has (an in-memory count
here; the real one, a host lost and back on the multi-host bed, is in test_multihost), and the
options refused before anything launches."""

from __future__ import annotations

import time

import pytest
from IPython.core.error import UsageError

from hvd_magic import HorovodRunner
from hvd_magic.options import make_options
from hvd_magic.protocol import ENV_ATTEMPT, ENV_RESIZED, ENV_RUN
from hvd_magic.protocol.files import checkpoint_name
from hvd_magic.rank.resized import resized
from hvd_magic.run.checkpoint_store import CheckpointStore
from hvd_magic.run.resize import Sizes

from .helpers import RecordingView


class Cluster:
    """Slots that a test sets; each count asked is kept."""

    def __init__(self, slots: int | None) -> None:
        self.slots, self.asked = slots, 0

    def __call__(self, options: object) -> int | None:
        self.asked += 1
        return self.slots


def sizes(tmp_path, cluster: Cluster, **given: object) -> tuple[Sizes, RecordingView, CheckpointStore]:
    options = make_options(np=4, retries=3, min_np=2, resize_wait=0, env={"A": "1"}, **given)  # type: ignore[arg-type]
    view, store = RecordingView(), CheckpointStore(str(tmp_path))
    return Sizes(options, view, store, cluster), view, store


def land(store: CheckpointStore, step: int) -> None:
    path = f"{store.folder}/{checkpoint_name(step)}"
    open(path, "wb").close()
    store.landed(path)


def test_after_a_loss_a_run_goes_on_with_the_slots_there_are_and_says_so(tmp_path):
    cluster = Cluster(3)
    resize, view, store = sizes(tmp_path, cluster)
    land(store, 20)
    run = resize.current.env[ENV_RUN]  # the run's id, in its first attempt's ranks too
    smaller = resize.next("executor or host lost: rank 3 on hostD ended without a word")
    assert smaller.np == 3 and smaller.env == {"A": "1", ENV_RESIZED: "4,3", ENV_ATTEMPT: "2", ENV_RUN: run}
    assert view.notices == [
        "hvd_magic: 4 → 3 ranks: executor or host lost: rank 3 on hostD ended without a word; 4 slots were "
        "not there within 0 s, from step 20"
    ]


def test_fewer_slots_than_min_np_or_none_told_keep_np(tmp_path):
    for slots in (1, None, 4, 6):
        resize, view, _ = sizes(tmp_path, Cluster(slots))
        assert resize.next("lost").np == 4 and ENV_RESIZED not in resize.current.env and view.notices == []
        assert resize.next("lost again").env[ENV_ATTEMPT] == "3"  # each attempt after the first its number


def test_without_min_np_the_slots_are_not_even_counted(tmp_path):
    cluster = Cluster(1)
    options = make_options(np=4, retries=3)
    resize = Sizes(options, RecordingView(), CheckpointStore(str(tmp_path)), cluster)
    assert resize.next("lost").np == 4 and cluster.asked == 0 and resize.grow_check() is None


def test_a_smaller_run_grows_at_a_checkpoint_once_the_slots_are_back(tmp_path):
    cluster = Cluster(3)
    resize, view, store = sizes(tmp_path, cluster)
    resize.next("lost")
    grow = resize.grow_check()
    assert grow is not None
    asked = cluster.asked
    assert not grow() and cluster.asked == asked  # no new checkpoint: the slots are not counted
    land(store, 25)
    assert not grow()  # a checkpoint, and still 3 slots
    cluster.slots = 4
    assert not grow()  # the slots are back, but no checkpoint landed since
    land(store, 30)
    assert grow()
    full = resize.next("")
    assert full.np == 4 and full.env[ENV_RESIZED] == "3,4" and resize.grow_check() is None
    assert view.notices[-1] == "hvd_magic: 3 → 4 ranks: the cluster has the slots again, from step 30"
    assert resize.changes == [notice.removeprefix("hvd_magic: ") for notice in view.notices]


class ComingBack(Cluster):
    """Slots that return one a count, up to ``full`` (an executor re-registering)."""

    def __init__(self, slots: int, full: int) -> None:
        super().__init__(slots)
        self.full = full

    def __call__(self, options: object) -> int | None:
        there = super().__call__(options)
        self.slots = min(self.full, (self.slots or 0) + 1)
        return there


def test_the_next_attempt_waits_for_the_slots_it_needs_and_says_so_once(tmp_path):
    """After a loss the next attempt waits for its np slots (a lost executor coming back) up to a
    deadline, instead of being refused at once by the launcher for want of them."""
    cluster = ComingBack(2, full=4)
    options = make_options(np=4, retries=3)
    view = RecordingView()
    resize = Sizes(options, view, CheckpointStore(str(tmp_path)), cluster)
    resize.next("lost")
    resize.wait_for_slots(time.monotonic() + 60, poll=0.01)
    assert cluster.asked == 3 and cluster.slots == 4  # 2, 3, then 4: there
    assert view.notices == ["hvd_magic: waiting up to 60 s for 4 slots (the cluster has 2 now)"]
    never = Cluster(1)
    resize = Sizes(options, RecordingView(), CheckpointStore(str(tmp_path)), never)
    began = time.monotonic()
    resize.wait_for_slots(began + 0.2, poll=0.01)  # gives up at the deadline: the launcher says why
    assert never.asked >= 2 and time.monotonic() - began < 30
    told = Cluster(None)  # Spark Connect or local ranks: nothing to wait for
    resize = Sizes(options, RecordingView(), CheckpointStore(str(tmp_path)), told)
    resize.wait_for_slots(time.monotonic() + 60)
    assert told.asked == 1


def test_resized_reads_the_attempts_change(monkeypatch):
    assert resized() is None
    monkeypatch.setenv(ENV_RESIZED, "4,3")
    assert resized() == (4, 3)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("np=4 min_np=2", "give retries= too"),
        ("np=4 retries=2 min_np=5", r"min_np=5 must be between 1 and np \(4\)"),
        ("np=4 retries=2 min_np=0", r"min_np=0 must be between 1 and np \(4\)"),
        ("np=4 retries=2 min_np=two", "min_np must be a whole number of ranks"),
        ("np=4 retries=2 resize_wait=10", "give min_np="),
        ("np=4 retries=2 min_np=2 resize_wait=soon", "resize_wait must be a number of seconds"),
    ],
)
def test_bad_min_np_is_refused_before_launch(ip, line, said):
    with pytest.raises(UsageError, match=said):
        ip.run_cell_magic("horovod", line, "1")


def test_min_np_is_for_a_job_not_a_live_session(ip):
    with pytest.raises(UsageError, match="min_np= restarts a run's ranks from its latest checkpoint"):
        ip.run_line_magic("horovod", "start np=-2 min_np=1")
    with pytest.raises(ValueError, match="give retries= too"):
        HorovodRunner(np=4, min_np=2)


def test_a_checkpoint_dir_that_holds_an_earlier_runs_checkpoints_is_said_at_the_start(tmp_path):
    """Its checkpoints outrank this run's lower steps (the folder keeps the highest): said once,
    with what to do; a fresh folder says nothing."""
    _, view, _ = sizes(tmp_path / "fresh", Cluster(4))
    assert view.notices == []
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for step in (800, 900):
        (earlier / checkpoint_name(step)).write_bytes(b"")
    _, view, _ = sizes(earlier, Cluster(4))
    (said,) = view.notices
    assert f"checkpoint_dir={earlier} holds checkpoints from before this run (steps 800, 900)" in said
    assert said.endswith("give a new run a folder of its own")
