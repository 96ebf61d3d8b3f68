#!/usr/bin/env bash
# uv (the project venv's) installing into PYTHON's environment, taking wheels from wherever pip is
# told to look (PIP_FIND_LINKS, or pip's configuration: a machine's own torch build, say), as pip
# itself would. Used by scripts/setup.sh and by tests/test_user_install.py.
#
#   bash scripts/uv_install.sh PYTHON [uv pip install arguments]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$1"
shift
uv=("$ROOT/.venv/bin/uv" pip install -q --python "$python")
for link in ${PIP_FIND_LINKS:-$("$python" -m pip config get global.find-links 2>/dev/null || true)}; do
    uv+=(--find-links "$link")
done
exec "${uv[@]}" "$@"
