"""``python -m hvd_magic doctor`` and ``%horovod_doctor``: what a run needs, checked, each failure
with its fix. Safe to run any time: it changes nothing, and what it imports it imports in a
separate process (a broken Horovod build cannot take the kernel down).

>>> report = doctor()            # doctest: +SKIP  (the active SparkSession's too, if there is one)
>>> report.ok, print(report)
"""

from __future__ import annotations

import html
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hvd_magic.doctor.checks import Check, local_checks

__all__ = ["Check", "Report", "doctor"]

NO_SESSION = "none active: np=N starts an embedded local one (np=-N needs none)"


@dataclass(frozen=True)
class Report:
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(check.ok is not False for check in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if check.ok is False]

    def __str__(self) -> str:
        width = max(len(check.name) for check in self.checks)
        lines = []
        for check in self.checks:
            lines.append(f"{check.mark} {check.name:<{width}}  {check.detail}")
            if check.fix:
                lines.append(f"  {'':<{width}}  fix: {check.fix}")
        verdict = "all checks passed" if self.ok else f"{len(self.failed)} check(s) failed"
        return "\n".join([*lines, verdict])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        colour = {True: "#1a7f37", False: "#cf222e", None: "#6e7781"}
        rows = "".join(
            f"<tr><td style='color:{colour[c.ok]};font-weight:bold'>{c.mark}</td>"
            f"<td>{html.escape(c.name)}</td><td>{html.escape(c.detail)}</td>"
            f"<td>{html.escape(c.fix)}</td></tr>"
            for c in self.checks
        )
        head = "<tr><th></th><th>check</th><th>found</th><th>fix</th></tr>"
        return f"<table class='hvd-doctor'>{head}{rows}</table>"


def _active_session() -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    return SparkSession.getActiveSession()


def doctor(session: Any = None, spark: bool = True) -> Report:
    """Checks this machine and, with ``spark``, ``session`` (default: the active SparkSession)."""
    session = session if session is not None or not spark else _active_session()
    if session is None:
        return Report(
            [*local_checks(), Check("Spark session", None, NO_SESSION)] if spark else local_checks()
        )
    from hvd_magic.doctor.spark import spark_checks

    with ThreadPoolExecutor(1) as pool:  # the local imports take seconds: run them beside the Spark job
        local = pool.submit(local_checks)
        remote = spark_checks(session)
        return Report(local.result() + remote)
