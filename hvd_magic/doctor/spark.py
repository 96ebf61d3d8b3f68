"""The doctor's checks of a Spark session (classic or Connect): what it offers the ranks, and a
small Spark job that asks the executors for their Python and packages and connects back to the
notebook the way a run's tasks do."""

from __future__ import annotations

import functools
import hmac
import json
import secrets
import socket
import sys
import threading
from typing import Any

from ..errors import HorovodMagicError
from ..install.detect import distribution_version
from ..launch import spark_session as sessions
from . import probe
from .checks import Check

__all__ = ["ReachListener", "executor_checks", "session_checks", "spark_checks"]

JOB_SECONDS = 60.0
REACH_SECONDS = 5.0
ADDRESS_FIX = (
    f"in the notebook, set os.environ['{sessions.ENV_DRIVER_HOST}'] to an address of its machine that "
    "the executors reach, and let them connect to it (firewall, security group)"
)


class ReachListener:
    """A TCP listener that answers ``ok`` only to peers that send its token first."""

    def __init__(self, host: str) -> None:
        self.token = secrets.token_hex(16)
        self._socket = socket.create_server((host, 0))
        self._socket.settimeout(0.2)
        self.address = f"{host}:{self._socket.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hvd_magic-doctor", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                peer, _ = self._socket.accept()
            except OSError:
                continue
            with peer:
                peer.settimeout(REACH_SECONDS)
                try:
                    line = peer.recv(64).strip().decode(errors="replace")
                    if hmac.compare_digest(line, self.token):
                        peer.sendall(b"ok\n")
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()


def session_checks(session: Any) -> list[Check]:
    kind = "Spark Connect" if sessions.is_connect(session) else "classic"
    master = sessions.conf(session, "spark.master") or "?"
    checks = [Check("Spark session", True, f"{kind}, Spark {session.version}, master {master}")]
    slots = sessions.slots_available(session)
    per_task = f"spark.task.cpus={sessions.task_cpus(session)}"
    checks.append(
        Check("task slots", None, f"not told by this session ({per_task})")
        if slots is None
        else Check("task slots", slots > 0, f"{slots} at once: np={slots} or fewer ({per_task})",
                   "" if slots else "add executors or cores (spark.executor.instances, spark.executor.cores)")
    )  # fmt: skip
    task_gpus = sessions.conf(session, "spark.task.resource.gpu.amount")
    executor_gpus = sessions.conf(session, "spark.executor.resource.gpu.amount")
    if executor_gpus and not task_gpus:
        fix = "set spark.task.resource.gpu.amount=1 so each rank is given its own GPU"
        checks.append(Check("GPUs", False, f"executors have {executor_gpus} each, tasks ask for none", fix))
    else:
        checks.append(Check("GPUs", None, f"{task_gpus} per task" if task_gpus else "none asked for"))
    dynamic = sessions.dynamic_allocation_on(
        master, sessions.conf(session, "spark.dynamicAllocation.enabled")
    )
    fix = (
        "spark.dynamicAllocation.enabled=false and a fixed spark.executor.instances: barrier mode refuses it"
    )
    checks.append(
        Check("dynamic allocation", not dynamic, "on" if dynamic else "off", fix if dynamic else "")
    )
    return checks


def _run_job(session: Any, tasks: int, listener: ReachListener) -> list[dict[str, Any]]:
    from pyspark import cloudpickle
    from pyspark.sql.functions import udf

    report = functools.partial(probe.executor_report, listener.token, listener.address, REACH_SECONDS)
    cloudpickle.register_pickle_by_value(probe)  # type: ignore[no-untyped-call]  # runs without hvd_magic
    tag = f"hvd_magic-doctor-{secrets.token_hex(4)}"
    rows: list[Any] = []
    failure: list[BaseException] = []

    def collect() -> None:
        session.addTag(tag)
        try:
            rows.extend(
                session.range(0, tasks, 1, tasks)
                .select(udf(report, "string", useArrow=False)("id"))
                .collect()
            )
        except Exception as err:  # noqa: BLE001 - reported as the check's finding
            failure.append(err)
        finally:
            session.removeTag(tag)

    worker = threading.Thread(target=collect, name="hvd_magic-doctor-job", daemon=True)
    worker.start()
    worker.join(JOB_SECONDS)
    cloudpickle.unregister_pickle_by_value(probe)  # type: ignore[no-untyped-call]
    if worker.is_alive():
        session.interruptTag(tag)
        raise TimeoutError(f"the check job did not finish in {JOB_SECONDS:.0f} s (no free executor?)")
    if failure:
        raise failure[0]
    return [json.loads(row[0]) for row in rows]


def _versions_check(reports: list[dict[str, Any]]) -> Check:
    mine = {
        "python": sys.version.split()[0],
        "hvd_magic": distribution_version("hvd_magic"),
        "horovod": distribution_version("horovod"),
    }
    differ = set()
    for report in reports:
        other = [f"{k} {report[k] or 'missing'}" for k, v in mine.items() if report[k] != v]
        if other:
            differ.add(f"{report['host']} ({report['executable']}): {', '.join(other)}")
    have = ", ".join(f"{k} {v or 'missing'}" for k, v in mine.items())
    if differ:
        fix = (
            "run the executors with the notebook's Python (spark.pyspark.python / PYSPARK_PYTHON), or "
            "install the same hvd_magic and Horovod wheel on them (README: Spark clusters)"
        )
        return Check(
            "executors' Python", False, f"the notebook has {have}; " + "; ".join(sorted(differ)), fix
        )
    return Check("executors' Python", True, f"{len(reports)} task(s) with {have}")


def executor_checks(session: Any, tasks: int) -> list[Check]:
    try:
        host = sessions.driver_address(session)
        listener = ReachListener(host)
    except (HorovodMagicError, OSError) as err:
        return [Check("notebook address", False, str(err), ADDRESS_FIX)]
    try:
        reports = _run_job(session, tasks, listener)
    except Exception as err:  # noqa: BLE001 - a job that fails is the finding
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        detail = f"the check job failed: {type(err).__name__}: {lines[-1] if lines else ''}"
        fix = "see the executors' Python: spark.pyspark.python / PYSPARK_PYTHON must name a working Python"
        return [Check("executors", False, detail[:400], fix)]
    finally:
        listener.close()
    unreached = sorted({f"{r['host']}: {r['reach']}" for r in reports if r["reach"]})
    reach = (
        Check(
            "executors reach the notebook",
            False,
            f"not at {listener.address}: " + "; ".join(unreached),
            ADDRESS_FIX,
        )
        if unreached
        else Check("executors reach the notebook", True, f"at {listener.address}")
    )
    return [_versions_check(reports), reach]


def spark_checks(session: Any) -> list[Check]:
    checks = session_checks(session)
    slots = sessions.slots_available(session)
    return checks + executor_checks(session, max(1, min(slots or 2, 8)))
