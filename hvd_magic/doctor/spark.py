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

from hvd_magic.doctor import probe
from hvd_magic.doctor.checks import Check
from hvd_magic.install.detect import distribution_version
from hvd_magic.launch import spark_session as sessions

__all__ = ["ReachListener", "executor_checks", "session_checks", "spark_checks"]

JOB_SECONDS = 60.0
EXECUTOR_WAIT_SECONDS = 30.0  # for a first executor of a session that has just started
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
            # one thread per peer: a peer that says nothing must not hold up the executors
            threading.Thread(target=self._answer, args=(peer,), daemon=True).start()

    def _answer(self, peer: socket.socket) -> None:
        with peer:
            try:
                peer.settimeout(REACH_SECONDS)
                if hmac.compare_digest(peer.recv(64).strip(), self.token.encode()):
                    peer.sendall(b"ok\n")
            except OSError:
                pass  # a peer that went away, or a stranger: nothing to answer

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()


def session_checks(session: Any, slots: int | None) -> list[Check]:
    kind = "Spark Connect" if sessions.is_connect(session) else "classic"
    master = sessions.conf(session, "spark.master") or "?"
    checks = [Check("Spark session", True, f"{kind}, Spark {session.version}, master {master}")]
    per_task = f"spark.task.cpus={sessions.task_cpus(session)}"
    if slots is None:
        checks.append(Check("task slots", None, f"not told by this session ({per_task})"))
    elif slots:
        checks.append(Check("task slots", True, f"{slots} at once: np={slots} or fewer ({per_task})"))
    else:
        fix = "add executors or cores (spark.executor.instances, spark.executor.cores)"
        none = f"none after {EXECUTOR_WAIT_SECONDS:.0f} s ({per_task})"
        checks.append(Check("task slots", False, none, fix))
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


def _tagging(session: Any) -> bool:
    """Job tags (to cancel the check's job alone): Connect sessions, and classic ones from Spark 4."""
    return sessions.is_connect(session) or int(str(session.version).split(".")[0]) >= 4


def _run_job(session: Any, tasks: int, listener: ReachListener) -> list[dict[str, Any]]:
    from pyspark import cloudpickle
    from pyspark.sql.functions import udf

    report = functools.partial(probe.executor_report, listener.token, listener.address, REACH_SECONDS)
    tag = f"hvd_magic-doctor-{secrets.token_hex(4)}" if _tagging(session) else ""
    rows: list[Any] = []
    failure: list[BaseException] = []

    def collect() -> None:
        try:
            if tag:
                session.addTag(tag)
            job = session.range(0, tasks, 1, tasks).select(udf(report, "string", useArrow=False)("id"))
            rows.extend(job.collect())
        except Exception as err:  # noqa: BLE001 - reported as the check's finding
            failure.append(err)
        finally:
            if tag:
                session.removeTag(tag)

    cloudpickle.register_pickle_by_value(probe)  # type: ignore[no-untyped-call]  # runs without hvd_magic
    worker = threading.Thread(target=collect, name="hvd_magic-doctor-job", daemon=True)
    try:
        worker.start()
        worker.join(JOB_SECONDS)
    finally:
        if worker.is_alive() and tag:
            sessions.cancel_tag(session, tag, JOB_SECONDS)  # timed out, or the user interrupted the doctor
        cloudpickle.unregister_pickle_by_value(probe)  # type: ignore[no-untyped-call]
    if worker.is_alive():
        raise TimeoutError(f"the check job did not finish in {JOB_SECONDS:.0f} s")
    if failure:
        raise failure[0]
    return [json.loads(row[0]) for row in rows]


def _versions_check(reports: list[dict[str, Any]]) -> Check:
    mine = {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",  # what PySpark requires equal
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
            "install the same hvd_magic and Horovod wheel on them (docs/installing.md: On a Spark cluster)"
        )
        return Check(
            "executors' Python", False, f"the notebook has {have}; " + "; ".join(sorted(differ)), fix
        )
    return Check("executors' Python", True, f"{len(reports)} task(s) with {have}")


def _last_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:400]


def executor_checks(session: Any, tasks: int) -> list[Check]:
    try:
        host = sessions.driver_address(session)
        listener = ReachListener(host)
    except Exception as err:  # noqa: BLE001 - an address this machine cannot listen on is the finding
        return [Check("notebook address", False, _last_line(err), ADDRESS_FIX)]
    try:
        reports = _run_job(session, tasks, listener)
    except TimeoutError as err:
        fix = "check that the cluster has free executors (a run needs them too), then run the doctor again"
        return [Check("executors", False, str(err), fix)]
    except Exception as err:  # noqa: BLE001 - a job that fails is the finding
        fix = "see the executors' Python: spark.pyspark.python / PYSPARK_PYTHON must name a working Python"
        return [Check("executors", False, f"the check job failed: {_last_line(err)}", fix)]
    finally:
        listener.close()
    if not reports:
        return [Check("executors", False, "the check job returned nothing", "run the doctor again")]
    unreached = sorted({f"{r['host']}: {r['reach']}" for r in reports if r["reach"]})
    name = "executors reach the notebook"
    reach = (
        Check(name, False, f"not at {listener.address}: " + "; ".join(unreached), ADDRESS_FIX)
        if unreached
        else Check(name, True, f"at {listener.address}")
    )
    return [_versions_check(reports), reach]


def spark_checks(session: Any) -> list[Check]:
    """Never raises: a session that cannot be asked (a stale Connect server, a restricted
    cluster) is itself the finding."""
    try:
        slots = sessions.wait_for_slots(session, 1, EXECUTOR_WAIT_SECONDS)
        checks = session_checks(session, slots)
    except Exception as err:  # noqa: BLE001
        fix = "check that the session still works (e.g. spark.range(1).collect()), or start a new one"
        return [Check("Spark session", False, f"cannot be asked: {_last_line(err)}", fix)]
    if slots == 0:
        return checks  # "task slots" says so (after a wait); a job would only wait for a slot
    return checks + executor_checks(session, max(1, min(slots or 2, 8)))
