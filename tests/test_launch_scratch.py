"""An executor's scratch directory for Open MPI: removed with its owner, also when the owner was
SIGKILLed (Spark kills lost executors' Python workers so), and, when its watcher was killed too
(the whole host), by the next claim on that host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hvd_magic.launch.scratch import PREFIX, HeldDir, sweep_unheld

CLAIM_AND_WAIT = """
import sys
from hvd_magic.launch.scratch import HeldDir
held = HeldDir.claim(sys.argv[1])
open(held.path + "/shared_mem_file", "w").close()  # what Open MPI leaves there
print(held.path, held.watcher.pid, flush=True)
sys.stdin.read()  # until killed
"""


def _owner(base: str) -> tuple[subprocess.Popen[str], str, int]:
    owner = subprocess.Popen(
        [sys.executable, "-c", CLAIM_AND_WAIT, base], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    path, watcher = owner.stdout.readline().split()
    return owner, path, int(watcher)


def _gone_within(path: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not os.path.exists(path)


def test_a_held_directory_is_kept_and_removed_by_its_owner(tmp_path):
    held = HeldDir.claim(str(tmp_path))
    assert os.path.basename(held.path).startswith(PREFIX)
    assert sweep_unheld(str(tmp_path)) == [] and os.path.isdir(held.path)  # its owner lives
    held.remove()
    assert os.listdir(tmp_path) == [] and held.watcher is not None and held.watcher.poll() == 0


def test_the_directory_of_a_sigkilled_owner_goes_at_once(tmp_path):
    owner, path, _ = _owner(str(tmp_path))
    assert sweep_unheld(str(tmp_path)) == [] and os.path.isdir(path)
    owner.kill()
    owner.wait(timeout=10)
    assert _gone_within(path, 10)  # its watcher saw the pipe close


def test_what_a_killed_host_left_goes_with_the_next_claim(tmp_path):
    owner, path, watcher = _owner(str(tmp_path))
    os.kill(watcher, signal.SIGKILL)  # the whole host: the watcher too
    owner.kill()
    owner.wait(timeout=10)
    assert os.path.isdir(path)
    newest = HeldDir.claim(str(tmp_path))
    assert os.listdir(tmp_path) == [os.path.basename(newest.path)]
    newest.remove()


def test_a_directory_left_without_a_lock_by_an_older_version_is_removed(tmp_path):
    (tmp_path / f"{PREFIX}old").mkdir()
    assert sweep_unheld(str(tmp_path)) == [str(tmp_path / f"{PREFIX}old")]
