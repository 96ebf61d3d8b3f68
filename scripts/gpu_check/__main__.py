"""Every GPU path of hvd_magic, proved on one single-GPU machine: ``scripts/gpu_check.sh``.

    scripts/gpu_check.sh --fetch        # here, with PyPI: the wheels and Horovod's source to carry
    scripts/gpu_check.sh --plan         # what it would carry, build and run; runs nothing
    scripts/gpu_check.sh                # on the GPU machine: one PASS/FAIL line a check, a summary
    scripts/gpu_check.sh --cpu          # the same checks' cells on the CPU (the suite runs this)

On the GPU each check runs in its own process with a time limit (a crash or a CUDA fault costs
only itself), its output in ``--out`` (``$OUT`` on the device tool); the whole run keeps within
``--budget`` seconds (8 minutes by default). ``--cpu`` runs the checks one after another in one
process, within the sum of their limits (and the budget): there is no GPU state for one to leave to the next,
and one Python, IPython and fork server instead of eight halves what the suite pays for it."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import carry
import checks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LIMITS = {"build": 330, "straggler": 180}  # seconds a check may take; others: DEFAULT_LIMIT
DEFAULT_LIMIT = 120
RESULT = "gpu_check result: "


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check.sh", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", action="store_true", help="print what would be carried, built and run")
    parser.add_argument("--fetch", action="store_true", help="download what to carry (needs PyPI)")
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python, for --fetch")
    parser.add_argument("--cpu", action="store_true", help="the checks' cells on the CPU, no build")
    parser.add_argument("--carry", type=Path, default=ROOT / ".gpu", help="the carried folder")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "gpu_check-out"))
    parser.add_argument("--only", default="", help="comma-separated checks (default: all)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run these checks in this process
    return parser.parse_args()


def chosen(only: str, cpu: bool = False) -> list[str]:
    """The checks ``--only`` names; by default all, but on the GPU those that travel apart."""
    default = [name for name in checks.CHECKS if cpu or name not in checks.APART]
    names = [name for name in only.split(",") if name] or default
    unknown = [name for name in names if name not in checks.CHECKS]
    if unknown:
        raise SystemExit(
            f"gpu_check: no check named {', '.join(unknown)}; the checks: {', '.join(checks.CHECKS)}"
        )
    return names


def carried_for(args: argparse.Namespace) -> carry.Carried:
    """The carried folder, and the groups of it that the chosen checks need."""
    needs = {group for name in chosen(args.only, args.cpu) for group in checks.NEEDS.get(name, ())}
    return carry.Carried(
        args.carry, tuple(group for group in carry.GROUPS if group == "ipython" or group in needs)
    )


def plan(args: argparse.Namespace) -> None:
    names = chosen(args.only, args.cpu)
    print("\n".join(carry.describe(carried_for(args))))
    if "build" in names:
        print("build: python -m hvd_magic install-horovod --without-mpi --sdist <carried sdist>")
        print("  (NCCL from the CUDA toolkit or the nvidia-nccl wheel, Gloo; pip resolves from the carried")
        print("  folder only; a Horovod wheel carried from an earlier run is installed instead of building)")
    print(f"run ({'CPU dry-run' if args.cpu else 'GPU'}, within {args.budget:.0f} s):")
    for name in names:
        doc = (checks.CHECKS[name].__doc__ or "").split("\n")[0]
        print(f"  {name:<11} {LIMITS.get(name, DEFAULT_LIMIT):>4} s  {doc}")
    apart = [name for name in checks.APART if name not in names]
    if apart:
        print(f"apart (what they need does not travel with the build's): --only {','.join(apart)}")


def environment(carried: carry.Carried, gpu: bool) -> dict[str, str]:
    env = carried.pip_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    if carried.sdist.exists():
        env["GPU_CHECK_SDIST"] = str(carried.sdist)
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    built = sorted(carried.folder.glob(f"horovod-*-{python}-*.whl"))
    if built:
        env["GPU_CHECK_WHEEL"] = str(built[-1])
    if gpu:
        env.setdefault("HVD_MAGIC_CACHE", str(Path("/tmp/gpu_check-cache")))
    return env


def describe_machine() -> str:
    smi = shutil.which("nvidia-smi")
    gpu = "no nvidia-smi"
    if smi:
        done = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        gpu = done.stdout.strip() or done.stderr.strip()
    tools = ", ".join(
        f"{tool} {'✓' if shutil.which(tool) else '✗'}" for tool in ("nvcc", "g++", "make", "cmake")
    )
    return f"Python {sys.version.split()[0]} at {sys.executable}; GPU: {gpu}; {tools}"


def run_checks(
    names: list[str], gpu: bool, env: dict[str, str], out: Path, limit: float
) -> dict[str, tuple[bool, str]]:
    """``names`` in one process within ``limit`` seconds: each check's result, or why it has none."""
    command = [sys.executable, str(HERE), "--one", ",".join(names)] + ([] if gpu else ["--cpu"])
    log = out / "logs" / f"{names[0] if len(names) == 1 else 'checks'}.log"
    timed_out = False
    with log.open("w") as sink:
        try:
            subprocess.run(
                command, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=limit, check=False
            )
        except subprocess.TimeoutExpired:
            timed_out = True
    text = log.read_text(errors="replace")
    said = {}
    for line in text.splitlines():
        if line.startswith(RESULT):
            name, passed, detail = json.loads(line[len(RESULT) :])
            said[name] = (bool(passed), str(detail))
    tail = " | ".join(text.strip().splitlines()[-5:])
    why = (
        f"did not finish within {limit:.0f} s (its output: {log})"
        if timed_out
        else f"ended without a result: {tail}"
    )
    return {name: said.get(name, (False, why)) for name in names}


def keep_build(out: Path, env: dict[str, str]) -> None:
    """The build's log, and the wheel it built where small enough to come back from the device
    (16 MB), for a later run to carry instead of building again."""
    for entry in Path(env.get("HVD_MAGIC_CACHE", "/nonexistent")).glob("horovod-*"):
        for path in [entry / "build.log", *entry.glob("horovod-*.whl")]:
            if path.is_file() and path.stat().st_size < 16 * 2**20:
                shutil.copy(path, out / path.name)


def report(outcomes: dict[str, tuple[bool, str]]) -> dict[str, bool]:
    """One ``PASS``/``FAIL name: detail`` line a check; whether each passed."""
    for name, (passed, detail) in outcomes.items():
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}", flush=True)
    return {name: passed for name, (passed, _) in outcomes.items()}


def gather_logs(out: Path) -> None:
    """One file of every check's output (the device tool brings back at most 8 files)."""
    logs = sorted((out / "logs").glob("*.log"))
    with (out / "checks.log").open("w") as whole:
        for log in logs:
            whole.write(log.read_text(errors="replace") + "\n")  # each check's part headed "===== name"
    shutil.rmtree(out / "logs")


def main() -> int:
    args = arguments()
    if args.one:
        for name in args.one.split(","):
            print(f"===== {name}", flush=True)
            started = time.monotonic()
            passed, detail = checks.run_one(name, gpu=not args.cpu)
            detail += f" ({time.monotonic() - started:.0f} s)"
            print(RESULT + json.dumps([name, passed, detail]), flush=True)
        return 0
    if args.fetch:
        carry.fetch(carried_for(args), args.python)
        print("\n".join(carry.describe(carried_for(args))))
        return 0
    if args.plan:
        plan(args)
        return 0
    names, began, folder = chosen(args.only, args.cpu), time.monotonic(), carried_for(args)
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {describe_machine()}", flush=True)
    gpu, env = not args.cpu, environment(folder, not args.cpu)
    results: dict[str, bool] = {}
    if gpu and folder.folder.is_dir():
        complaint = carry.install(folder)
        results["carry"] = not complaint
        installed = [name for group in folder.groups for name in carry.ENTRY_POINTS.get(group, ())]
        said = complaint or f"{', '.join(installed)} from the carried wheels"
        print(f"{'PASS' if not complaint else 'FAIL'} carry: {said}", flush=True)
    batches = [[name] for name in names] if gpu else [names]  # --cpu: one process, the limits added
    for batch in batches:
        left = args.budget - (time.monotonic() - began)
        if left < 20:
            for name in batch:
                print(f"FAIL {name}: not run, the budget of {args.budget:.0f} s is spent", flush=True)
                results[name] = False
            continue
        limit = min(sum(LIMITS.get(name, DEFAULT_LIMIT) for name in batch), left)
        results.update(report(run_checks(batch, gpu, env, args.out, limit)))
        if gpu and batch == ["build"]:
            keep_build(args.out, env)
    gather_logs(args.out)
    failed = [name for name, passed in results.items() if not passed]
    took = time.monotonic() - began
    mode = "GPU" if gpu else "CPU dry-run"
    print(f"gpu_check ({mode}): {len(results) - len(failed)} passed, {len(failed)} failed in {took:.0f} s"
          + (f": {', '.join(failed)}" if failed else ""), flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
