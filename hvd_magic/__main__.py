"""``python -m hvd_magic`` (also the ``hvd-magic`` command): install-horovod and doctor."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hvd_magic.errors import HorovodMagicError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hvd_magic", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser(
        "install-horovod",
        help="build Horovod 0.28.1 for this environment (cached) and install it",
        description="Builds Horovod 0.28.1 from its sdist for the torch/TensorFlow/MPI installed here, "
        "with the changes today's frameworks need; caches the wheel by what it was built against.",
    )
    install.add_argument("--dry-run", action="store_true", help="print the plan; build and install nothing")
    install.add_argument("--rebuild", action="store_true", help="build anew even if the cache has a wheel")
    install.add_argument("--without-mpi", action="store_true", help="build with Gloo only (no MPI needed)")
    install.add_argument("--cache", type=Path, help="the wheel cache (default: ~/.cache/hvd_magic)")
    install.add_argument("--sdist", type=Path, help="a local horovod-0.28.1.tar.gz instead of PyPI's")
    doctor = commands.add_parser("doctor", help="check what a run needs, each failure with its fix")
    doctor.add_argument(
        "--spark",
        metavar="MASTER",
        help="also check this Spark: a master URL, or sc://host for Spark Connect",
    )
    return parser


def _doctor(master: str | None) -> int:
    from hvd_magic.doctor import doctor

    session = None
    if master:
        try:
            from pyspark.sql import SparkSession

            builder = SparkSession.builder
            builder = builder.remote(master) if master.startswith("sc://") else builder.master(master)
            session = builder.getOrCreate()
        except Exception as err:  # noqa: BLE001 - ImportError, a master that does not answer, ...
            print(f"hvd_magic doctor: cannot start a Spark session on {master}: {err}", file=sys.stderr)
            return 2
    report = doctor(session, spark=session is not None)
    print(report)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "install-horovod":
            from hvd_magic.install import install_horovod

            return install_horovod(args.cache, args.dry_run, args.rebuild, not args.without_mpi, args.sdist)
        return _doctor(args.spark)
    except HorovodMagicError as err:
        print(f"hvd_magic {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
