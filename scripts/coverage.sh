#!/usr/bin/env bash
# hvd_magic's line coverage across every Python process the suite starts: the tests themselves,
# the ranks, Spark's Python workers and tasks, the exec agents and the notebook kernels. It uses
# coverage.py's subprocess support: a .pth file, present only while this runs, starts measuring
# in each Python process whose environment names the configuration (COVERAGE_PROCESS_START).
# Processes on the multi-host bed's hosts write into their own /tmp and are not counted; ranks
# killed by SIGKILL (on purpose, in the fault tests) save nothing. Ranks forked warm and the
# processes that end with os._exit are counted (coverage.py's fork and _exit patches).
#
#   bash scripts/coverage.sh [pytest arguments]     # default: the suite as `make test` runs it
# Prints the total; the report is in test-artifacts/coverage/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
OUT="$ROOT/test-artifacts/coverage"
DATA="/tmp/hvd_magic-coverage-$$"
rm -rf "$OUT" "$DATA" && mkdir -p "$OUT" "$DATA"
cat > "$OUT/coveragerc" <<RC
[run]
source_pkgs = hvd_magic
parallel = true
data_file = $DATA/.coverage
concurrency = thread
sigterm = true
# warm ranks are forked from a fork server and end with os._exit, as do its waiters; a stand-in
# that cannot reach its server execs the worker
patch = fork, _exit, execv

[report]
skip_empty = true
RC
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pth="$site/hvd_magic_coverage.pth"
echo "import coverage; coverage.process_startup()" > "$pth"
trap 'rm -f "$pth"' EXIT
cd "$ROOT"
# shellcheck disable=SC2046  # the arguments, word by word
[ $# -gt 0 ] || set -- $(make -s --no-print-directory -C "$ROOT" pytest-args)  # as `make test` runs it
status=0
COVERAGE_PROCESS_START="$OUT/coveragerc" "$PY" -m pytest "$@" || status=$?
rm -f "$pth"
# The fork servers' preloaders outlive the kernels that used them (they end when idle, minutes
# on): ended here, as idleness ends them, so that they write their data before it is combined
pkill -TERM -f -- "$PY -m hvd_magic.warm.preloader --detached" || true
for _ in $(seq 100); do pgrep -f -- "$PY -m hvd_magic.warm.preloader --detached" > /dev/null || break; sleep 0.1; done
"$PY" -m coverage combine --quiet --rcfile "$OUT/coveragerc" --data-file "$OUT/.coverage" "$DATA"
"$PY" -m coverage report --rcfile "$OUT/coveragerc" --data-file "$OUT/.coverage" > "$OUT/report.txt"
rm -rf "$DATA"
grep "^TOTAL" "$OUT/report.txt"
exit "$status"
