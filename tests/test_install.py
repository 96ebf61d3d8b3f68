"""install-horovod: the plan from what is installed, the cache that serves compatible
environments, the source changes, and the one message that names what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from hvd_magic.errors import InstallError
from hvd_magic.install.build import build_wheel
from hvd_magic.install.detect import Found, Nccl, Toolchain, detect, find_cmake
from hvd_magic.install.edits import (
    IN_PHASE,
    MARKED_DONE,
    NEGOTIATED,
    RESET,
    SPINNING_WAIT,
    WRITER_IDLE,
    patch_source,
)
from hvd_magic.install.plan import (
    CACHE_PREFIX,
    HOROVOD_VERSION,
    SOURCE_EDITS,
    BuildPlan,
    cached_wheel,
    make_plan,
)

GPP = Found("g++", "12.2.0")
CMAKE = Found("cmake", "3.25.1")


def toolchain(**changes: object) -> Toolchain:
    base = dict(
        python="3.11", torch="2.13.0+cpu", torch_cuda=None, torch_problem="", tensorflow="2.21.0",
        mpirun="4.1.4", mpi_headers=True, compiler=GPP, cmake=CMAKE, nccl=None,
    )  # fmt: skip
    return Toolchain(**{**base, **changes})  # type: ignore[arg-type]


def test_the_cache_key_names_what_the_wheel_is_built_against(tmp_path):
    plan = make_plan(toolchain(), tmp_path)
    assert plan.key == "py311-torch2.13.0+cpu-tf2.21.0-ompi4.1.4"  # as scripts/setup.sh always named it
    assert plan.directory == tmp_path / f"horovod-{HOROVOD_VERSION}-edits{SOURCE_EDITS}-{plan.key}"
    gpu = make_plan(toolchain(torch="2.13.0+cu124", torch_cuda="12.4", nccl=Nccl("/usr/include")), tmp_path)
    assert gpu.key.endswith("-cu12.4") and gpu.build_env()["HOROVOD_GPU_OPERATIONS"] == "NCCL"


def test_what_is_installed_is_built_and_the_rest_left_out(tmp_path):
    env = make_plan(toolchain(tensorflow=None), tmp_path, with_mpi=False).build_env()
    assert env["HOROVOD_WITH_PYTORCH"] == env["HOROVOD_WITHOUT_TENSORFLOW"] == "1"
    assert env["HOROVOD_WITHOUT_MPI"] == env["HOROVOD_WITH_GLOO"] == env["HOROVOD_WITHOUT_MXNET"] == "1"
    assert "HOROVOD_GPU_OPERATIONS" not in env


def cache_entry(cache: Path, key: str) -> Path:
    entry = cache / f"{CACHE_PREFIX}{key}"
    entry.mkdir(parents=True)
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    wheel = entry / f"horovod-{HOROVOD_VERSION}-cp311-cp311-{platform}.whl"
    wheel.write_bytes(b"")
    return wheel


def test_a_cached_wheel_serves_every_environment_it_was_built_for(tmp_path):
    both = cache_entry(tmp_path, "py311-torch2.13.0+cpu-tf2.21.0-ompi4.1.4")
    assert cached_wheel(make_plan(toolchain(), tmp_path)) == both
    # torch alone, same torch: the wheel's TensorFlow ops are simply not used
    assert cached_wheel(make_plan(toolchain(tensorflow=None), tmp_path)) == both
    assert cached_wheel(make_plan(toolchain(torch="2.14.1+cpu"), tmp_path)) is None
    assert cached_wheel(make_plan(toolchain(python="3.12"), tmp_path)) is None
    assert cached_wheel(make_plan(toolchain(), tmp_path, with_mpi=False)) is None
    other_machine = tmp_path / f"{CACHE_PREFIX}py311-torch2.13.0+cpu-tfnone-ompi4.1.4"
    other_machine.mkdir()
    (other_machine / f"horovod-{HOROVOD_VERSION}-cp311-cp311-some_other_arch.whl").write_bytes(b"")
    assert cached_wheel(make_plan(toolchain(tensorflow=None), tmp_path)) == both  # not another platform's
    (other_machine / f"horovod-{HOROVOD_VERSION}-cp311-cp311-some_other_arch.whl").unlink()
    other_machine.rmdir()
    own = cache_entry(tmp_path, "py311-torch2.13.0+cpu-tfnone-ompi4.1.4")
    assert cached_wheel(make_plan(toolchain(tensorflow=None), tmp_path)) == own  # its own entry first


def test_a_wheel_cached_before_the_source_edits_last_changed_is_built_anew(tmp_path):
    earlier = tmp_path / f"horovod-{HOROVOD_VERSION}-py311-torch2.13.0+cpu-tf2.21.0-ompi4.1.4"  # no revision
    earlier.mkdir()
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    (earlier / f"horovod-{HOROVOD_VERSION}-cp311-cp311-{platform}.whl").write_bytes(b"")
    assert cached_wheel(make_plan(toolchain(), tmp_path)) is None


def test_missing_prerequisites_are_named_with_the_one_command_that_installs_them(tmp_path):
    with pytest.raises(InstallError) as info:
        make_plan(toolchain(compiler=Found("g++", None), mpirun=None, mpi_headers=False), tmp_path)
    message = str(info.value)
    assert "a C++17 compiler, Open MPI, its headers" in message
    if Path("/etc/debian_version").exists():
        assert "sudo apt-get install -y g++ openmpi-bin libopenmpi-dev" in message
    assert "--without-mpi" in message
    make_plan(toolchain(mpirun=None, mpi_headers=False), tmp_path, with_mpi=False)  # Gloo only: fine
    with pytest.raises(InstallError, match="neither PyTorch nor TensorFlow"):
        make_plan(toolchain(torch=None, tensorflow=None), tmp_path)
    with pytest.raises(
        InstallError, match=r"torch 2.13.0\+cpu is installed but does not import \(OSError: libx"
    ):
        make_plan(toolchain(torch_problem="OSError: libx.so: cannot open"), tmp_path)


def test_a_cmake_the_build_cannot_use_is_installed_by_pip_first(tmp_path):
    assert "cmake>=3.13,<4" in make_plan(toolchain(cmake=Found("cmake", "4.1.0")), tmp_path).pip_first
    assert "cmake>=3.13,<4" in make_plan(toolchain(cmake=Found("cmake", None)), tmp_path).pip_first
    assert "cmake>=3.13,<4" not in make_plan(toolchain(), tmp_path).pip_first


def horovod_like_tree(root: Path) -> Path:
    """The lines of Horovod 0.28.1's source that the build changes, where they are."""
    source = root / f"horovod-{HOROVOD_VERSION}"
    for path, text in {
        "CMakeLists.txt": "project(horovod)\nset(CMAKE_CXX_STANDARD 14)\n",
        "horovod/torch/CMakeLists.txt": "set(CMAKE_CXX_STANDARD 14)\n",
        "horovod/tensorflow/CMakeLists.txt": "list(APPEND SOURCES mpi_ops.cc\n    xla_mpi_ops.cc)\n",
        "horovod/tensorflow/keras/__init__.py": "import tensorflow as tf\nfrom keras import backend as K\n",
        "horovod/tensorflow/keras/callbacks.py": "def f():\n  from keras import backend as K\n",
        "horovod/common/ops/cuda/CMakeLists.txt": "set(CMAKE_CUDA_STANDARD 11)\n",
        "horovod/torch/cuda_util.cc": 'cudalib = dlopen("libcuda.so", RTLD_LAZY);\n',
        "horovod/common/operations.cc": "  for (auto process_set_id : ids) {\n" + NEGOTIATED + "  }\n",
        "horovod/torch/handle_manager.h": "#include <mutex>\n  bool PollHandle(int handle);\n"
        + "  std::mutex mutex_;\n",
        "horovod/torch/handle_manager.cc": f"void MarkDone() {{\n{MARKED_DONE}void Reset() {{\n{RESET}}}\n",
        "horovod/torch/mpi_ops_v2.cc": f"void WaitAndClear(int handle) {{\n{SPINNING_WAIT}}}\n",
        "horovod/common/timeline.cc": f"void TimelineWriter::WriterLoop() {{\n{WRITER_IDLE}}}\n",
    }.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_text(text)
    return source


def test_the_source_changes_for_todays_frameworks(tmp_path):
    source = horovod_like_tree(tmp_path)
    patch_source(source, with_tensorflow=True)
    assert "CMAKE_CXX_STANDARD 17" in (source / "horovod/torch/CMakeLists.txt").read_text()
    assert "xla_mpi_ops" not in (source / "horovod/tensorflow/CMakeLists.txt").read_text()
    assert "\n  K = tf.keras.backend" in (source / "horovod/tensorflow/keras/callbacks.py").read_text()
    assert "CMAKE_CUDA_STANDARD 17" in (source / "horovod/common/ops/cuda/CMakeLists.txt").read_text()
    assert 'dlopen("libcuda.so.1",' in (source / "horovod/torch/cuda_util.cc").read_text()
    # idle MPI ranks in phase: the next cycle counts from an idle negotiation's end
    operations = (source / "horovod/common/operations.cc").read_text()
    assert NEGOTIATED + IN_PHASE in operations
    resets = "state.last_cycle_start = std::chrono::steady_clock::now();"  # on MPI's idle cycles only
    assert operations.index(resets) > operations.index("LibType::MPI") > operations.index(NEGOTIATED)
    # PyTorch's wait for a collective and the timeline's writer sleep: no loop that only yields
    torch = {
        name: (source / "horovod/torch" / name).read_text()
        for name in ("handle_manager.h", "handle_manager.cc", "mpi_ops_v2.cc")
    }
    assert "std::condition_variable done_;" in torch["handle_manager.h"]
    assert torch["handle_manager.cc"].count("done_.notify_all();") == 2  # a handle done; all cleared
    assert "done_.wait(lock," in torch["handle_manager.cc"]
    assert "handle_manager.WaitForHandle(handle);" in torch["mpi_ops_v2.cc"]
    assert "this_thread::yield" not in torch["mpi_ops_v2.cc"]
    assert "gil_scoped_release" in torch["mpi_ops_v2.cc"]  # the wait lets the rank's threads run
    writer = (source / "horovod/common/timeline.cc").read_text()
    assert "this_thread::yield" not in writer and "sleep_for(std::chrono::milliseconds(1))" in writer
    with pytest.raises(InstallError, match="Horovod's source changed: CMakeLists.txt"):
        patch_source(source, with_tensorflow=True)  # a source that no longer looks as expected


FAKE_SETUP = """
import json, os
from setuptools import setup
seen = dict((k, v) for k, v in os.environ.items() if k.startswith("HOROVOD_"))
if "HOROVOD_NCCL_HOME" in seen:  # the NCCL home's links, while the build can see them
    home = seen["HOROVOD_NCCL_HOME"]
    seen["links"] = [os.readlink(os.path.join(home, name)) for name in ("include", "lib/libnccl.so")]
    seen["PATH"] = os.environ["PATH"]
with open(os.environ["HVD_TEST_BUILD_ENV"], "w") as out:
    json.dump(seen, out)
setup(name=NAME, version="0.28.1", py_modules=[])
"""


def fake_sdist(root: Path, name: str = "horovod") -> Path:
    """A source archive laid out as Horovod's, whose setup.py records the build's switches."""
    source = horovod_like_tree(root / "src")
    (source / "setup.py").write_text(f"NAME = {name!r}\n" + FAKE_SETUP)
    sdist = root / f"horovod-{HOROVOD_VERSION}.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(source, arcname=source.name)
    return sdist


def test_the_build_patches_builds_with_its_switches_and_caches_the_whole_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("HVD_TEST_BUILD_ENV", str(tmp_path / "env.json"))
    plan = BuildPlan(toolchain(tensorflow=None), tmp_path / "cache", with_mpi=True, pip_first=())
    wheel = build_wheel(plan, lambda line: None, fake_sdist(tmp_path))
    assert wheel.parent == plan.directory and wheel.name.startswith("horovod-0.28.1-")
    assert sorted(p.name for p in plan.directory.iterdir()) == ["build.log", wheel.name]  # no .partial
    switches = json.loads((tmp_path / "env.json").read_text())
    assert switches["HOROVOD_WITH_PYTORCH"] == "1" and switches["HOROVOD_WITHOUT_TENSORFLOW"] == "1"
    assert switches["HOROVOD_CMAKE"] == find_cmake().name  # the cmake the plan checked, not the PATH's


def test_pips_nccl_is_built_against_where_its_wheel_put_it(tmp_path, monkeypatch):
    """CUDA PyTorch brings NCCL as a wheel (``nvidia/nccl/{include,lib}``, only ``libnccl.so.2``):
    the build gets a NCCL home of links to it, shared linking, and the CUDA toolkit's real folder."""
    wheel = tmp_path / "site-packages" / "nvidia" / "nccl"
    (wheel / "include").mkdir(parents=True)
    (wheel / "lib").mkdir()
    (wheel / "lib" / "libnccl.so.2").write_bytes(b"")
    nccl = Nccl(str(wheel / "include"), str(wheel / "lib"))
    cuda = dict(torch="2.11.0+cu130", torch_cuda="13.0", nccl=nccl, cuda_home="/opt/cuda")
    gpu = toolchain(tensorflow=None, **cuda)
    plan = BuildPlan(gpu, tmp_path / "cache", with_mpi=False, pip_first=())
    env = plan.build_env()
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_NCCL_LINK"] == "SHARED"
    assert env["HOROVOD_CUDA_HOME"] == env["CUDA_HOME"] == "/opt/cuda"
    assert plan.key.endswith("-cu13.0") and str(wheel / "include") in plan.describe(None)
    monkeypatch.setenv("HVD_TEST_BUILD_ENV", str(tmp_path / "env.json"))
    monkeypatch.setenv("HOROVOD_NCCL_LIB", "/somewhere/else")  # would be searched before the home
    build_wheel(plan, lambda line: None, fake_sdist(tmp_path))
    switches = json.loads((tmp_path / "env.json").read_text())
    assert "HOROVOD_NCCL_LIB" not in switches and Path(switches["HOROVOD_NCCL_HOME"]).name == "nccl"
    assert switches["links"] == [str(wheel / "include"), str(wheel / "lib" / "libnccl.so.2")]
    assert switches["PATH"].startswith("/opt/cuda/bin:")  # the toolkit's nvcc, not a wrapper elsewhere


def test_a_build_without_a_wheel_or_a_bad_archive_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HVD_TEST_BUILD_ENV", str(tmp_path / "env.json"))
    plan = BuildPlan(toolchain(tensorflow=None), tmp_path / "cache", with_mpi=True, pip_first=())
    with pytest.raises(InstallError, match="the build ended without a Horovod wheel; see its log: "):
        build_wheel(plan, lambda line: None, fake_sdist(tmp_path / "other", name="not_horovod"))
    assert cached_wheel(plan) is None
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not a tar archive")
    with pytest.raises(InstallError, match="broken.tar.gz does not unpack"):
        build_wheel(plan, lambda line: None, broken)


def run_cli(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path if path is not None else os.environ["PATH"]}
    return subprocess.run(
        [sys.executable, "-m", "hvd_magic", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_dry_run_prints_the_plan_of_this_environment_and_changes_nothing():
    found = detect()
    done = run_cli("install-horovod", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"PyTorch         {found.torch}: its ops are built" in done.stdout
    assert f"Open MPI {found.mpirun}: built in" in done.stdout
    assert "cached: horovod-0.28.1-" in done.stdout  # scripts/setup.sh installed through the same cache
    assert "[install-horovod]" not in done.stdout


def test_without_a_compiler_or_mpi_on_path_the_message_says_what_to_install(tmp_path):
    done = run_cli("install-horovod", "--dry-run", path=str(tmp_path))  # nothing on PATH
    assert done.returncode == 2
    assert "building Horovod needs a C++17 compiler, Open MPI, its headers" in done.stderr
    assert "Traceback" not in done.stderr
