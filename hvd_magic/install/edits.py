"""What ``install-horovod`` changes in Horovod 0.28.1's source before building it.

Horovod 0.28.1 predates PyTorch >= 2.1 (whose headers need C++17), TensorFlow >= 2.19 (whose XLA
op API changed) and Keras 3 (its Keras binding imports the Keras 3 backend): those changes. And
three of its waits that keep a core busy while a rank has nothing to do, which on a machine with
fewer cores than busy threads (two ranks on two cores, a Spark executor's tasks) take that core
from the ranks' own work: an idle MPI rank's negotiation, a PyTorch rank waiting for its
collective, and the timeline's writer. Each edit fails loudly where the source no longer looks as
expected; ``plan.SOURCE_EDITS`` counts their revisions.
"""

from __future__ import annotations

import re
from pathlib import Path

from hvd_magic.errors import InstallError

__all__ = ["patch_source"]

KERAS_IMPORT = re.compile(r"^(\s*)from keras import backend as K$", re.MULTILINE)
# Horovod's background thread starts a cycle HOROVOD_CYCLE_TIME (5 ms) after the last one started
# and negotiates in it with every rank: over MPI a collective that busy-waits for the last rank to
# come. Ranks whose cycles are out of phase keep their offset for good, and an idle rank spins a
# core for it (seen here: 8.0 CPU-s in an 8 s sleep after hvd.init(), the other rank 0.16; Horovod
# issue #2804). After a cycle with nothing to do, the next counts from the negotiation's end,
# the same moment on every rank: idle ranks fall in phase and sleep (0.27 CPU-s each). Busy
# cycles keep their pace; Gloo, which waits without spinning, keeps its own (in phase, its idle
# ranks took more: 1.0-2.0 CPU-s against 0.6).
NEGOTIATED = """    if (process_set_id == 0) {
      state.mark_cycles_in_timeline =
          state.timeline_controller.MarkCyclesInTimelinePending();
    }
"""
IN_PHASE = """    if (process_set_id == 0 && state.control_operation == LibType::MPI &&
        response_list.responses().empty()) {
      state.last_cycle_start = std::chrono::steady_clock::now();  // hvd_magic: idle ranks in phase
    }
"""


def _edit(path: Path, old: str | re.Pattern[str], new: str) -> None:
    text = path.read_text()
    changed = old.sub(new, text) if isinstance(old, re.Pattern) else text.replace(old, new)
    if changed == text:
        raise InstallError(
            f"Horovod's source changed: {path.name} no longer has {getattr(old, 'pattern', old)!r}"
        )
    path.write_text(changed)


# PyTorch's `synchronize()` (every DistributedOptimizer step, every allreduce()) waits for
# Horovod's background thread to finish the collective by polling its handle in a loop that only
# yields: the training thread spins for the whole wait, up to a cycle (5 ms) and the other ranks'
# lateness each step. Measured here, two ranks on two cores, a small model, 1,600 steps: 7 to 8
# CPU-s a rank, where the same steps alone take 1.8. The handle manager now signals a condition
# when a handle is done, and the wait sleeps on it, without Python's lock.
HANDLES_HEADER = ("#include <mutex>\n", "#include <condition_variable>\n#include <mutex>\n")
HANDLES_WAIT = (
    "  bool PollHandle(int handle);\n",
    "  bool PollHandle(int handle);\n  void WaitForHandle(int handle);  // hvd_magic: sleeps until done\n",
)
HANDLES_SIGNAL = ("  std::mutex mutex_;\n", "  std::mutex mutex_;\n  std::condition_variable done_;\n")
MARKED_DONE = "  results_[handle] = std::make_shared<Status>(status);\n}\n"
WAIT_FOR_HANDLE = """
void HandleManager::WaitForHandle(int handle) {  // hvd_magic: a wait that sleeps
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] {
    auto found = results_.find(handle);
    if (found == results_.end()) {
      throw std::invalid_argument("Handle " + std::to_string(handle) +
                                  " was not created or has been cleared.");
    }
    return found->second != nullptr;
  });
}
"""
RESET = "  results_.clear();\n  last_handle_ = 0;\n"
SPINNING_WAIT = """  while (true) {
    if (handle_manager.PollHandle(handle)) break;
    {
      py::gil_scoped_release release_python_gil;
      std::this_thread::yield();
    }
  }
"""
SLEEPING_WAIT = """  {
    py::gil_scoped_release release_python_gil;
    handle_manager.WaitForHandle(handle);  // hvd_magic: instead of polling in a yield loop
  }
"""
# The timeline's writer thread (rank 0, with HOROVOD_TIMELINE set) drains its queue, then yields
# and looks again, for as long as Horovod runs: a core while the rank trains or waits. It now
# sleeps a millisecond when the queue is empty (the queue holds a million records).
WRITER_IDLE = """    // Allow scheduler to schedule other work for this core.
    std::this_thread::yield();
"""
WRITER_SLEEPS = """    // hvd_magic: the queue is empty; sleep rather than spin until records come
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
"""


def _sleeping_waits(horovod: Path) -> None:
    """The PyTorch binding's wait for a handle and the timeline's writer sleep instead of spinning."""
    handles = horovod / "torch" / "handle_manager.h"
    for old, new in (HANDLES_HEADER, HANDLES_WAIT, HANDLES_SIGNAL):
        _edit(handles, old, new)
    manager = horovod / "torch" / "handle_manager.cc"
    _edit(manager, MARKED_DONE, MARKED_DONE.replace("}\n", "  done_.notify_all();\n}\n") + WAIT_FOR_HANDLE)
    _edit(manager, RESET, RESET + "  done_.notify_all();  // hvd_magic: waiters of cleared handles\n")
    _edit(horovod / "torch" / "mpi_ops_v2.cc", SPINNING_WAIT, SLEEPING_WAIT)
    _edit(horovod / "common" / "timeline.cc", WRITER_IDLE, WRITER_SLEEPS)


def patch_source(source: Path, with_tensorflow: bool) -> None:
    """This module's changes (today's frameworks', and the waits), applied to an unpacked
    Horovod source tree."""
    for cmake in (source / "CMakeLists.txt", source / "horovod" / "torch" / "CMakeLists.txt"):
        _edit(cmake, "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)")
    # CUDA 13's headers need C++17 too; and the driver's library is libcuda.so.1 on a machine
    # without CUDA's development files (the unversioned name comes with them).
    cuda_kernels = source / "horovod" / "common" / "ops" / "cuda" / "CMakeLists.txt"
    _edit(cuda_kernels, "set(CMAKE_CUDA_STANDARD 11)", "set(CMAKE_CUDA_STANDARD 17)")
    _edit(source / "horovod" / "torch" / "cuda_util.cc", 'dlopen("libcuda.so",', 'dlopen("libcuda.so.1",')
    if with_tensorflow:
        tf_cmake = source / "horovod" / "tensorflow" / "CMakeLists.txt"
        lines = tf_cmake.read_text().splitlines(keepends=True)
        kept = [line for line in lines if "xla_mpi_ops.cc" not in line]
        if len(kept) == len(lines):
            raise InstallError(f"Horovod's source changed: {tf_cmake} no longer lists xla_mpi_ops.cc")
        tf_cmake.write_text("".join(kept))
    keras = source / "horovod" / "tensorflow" / "keras"
    for module in (keras / "__init__.py", keras / "callbacks.py"):
        _edit(module, KERAS_IMPORT, r"\1K = tf.keras.backend")
    _edit(source / "horovod" / "common" / "operations.cc", NEGOTIATED, NEGOTIATED + IN_PHASE)
    _sleeping_waits(source / "horovod")
