#!/usr/bin/env bash
# Build Horovod 0.28.1 from PyPI's source release against the torch installed in the venv, cache
# the wheel outside the repository, and install it into the venv.  (`make horovod` runs this.)
#
#   scripts/build_horovod.sh [VENV]        VENV defaults to <repo>/.venv
#
# - Frameworks: PyTorch only (HOROVOD_WITH_PYTORCH=1, WITHOUT TensorFlow/MXNet); controller and
#   CPU collectives: gloo (HOROVOD_WITH_GLOO=1, HOROVOD_WITHOUT_MPI=1).  NCCL for GPU tensors
#   only when torch is a CUDA build AND nvcc is found AND an NCCL (pip's nvidia-nccl-cu* or
#   $HOROVOD_NCCL_HOME) is there; otherwise a CPU build.
# - C++17: torch >= 2.1's headers need it, but Horovod 0.28.1's CMake sets CXX_STANDARD 14
#   (fixed upstream after 0.28.1, unreleased).  A compiler wrapper appends -std=c++17 after
#   every other flag, so the last -std wins.
# - Cache: ${SCALING_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaling/wheels}/<key>/, the
#   key being horovod version + torch version + CPython tag + cpu/cuda variant, so another
#   torch (or python, or a GPU machine) builds its own wheel.  With the wheel cached this
#   takes seconds.  HOROVOD_REBUILD=1 ignores the cache.
# - Build tools: cmake from PyPI, pinned below (<4: CMake 4 refuses gloo's old
#   cmake_minimum_required), installed into the venv only when a build is needed; a C++
#   compiler (g++ >= 9 for C++17) must be on PATH.
set -euo pipefail

HOROVOD_VERSION=0.28.1
CMAKE_PIN=3.31.10

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "${1:-$REPO/.venv}" && pwd)"
PY="$VENV/bin/python"
CACHE_ROOT="${SCALING_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaling/wheels}"
JOBS="${HOROVOD_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"

log() { echo "[build_horovod] $*" >&2; }

[ -x "$PY" ] || { log "no python at $PY (make install first)"; exit 2; }

# What the wheel depends on: torch's exact version (the extension links libtorch), the
# interpreter, and whether GPU operations are compiled in.
read -r TORCH_VERSION TORCH_CUDA PY_TAG < <("$PY" -c '
import sys, torch
print(torch.__version__, torch.version.cuda or "none", f"cp{sys.version_info[0]}{sys.version_info[1]}")')

VARIANT=cpu
NCCL_HOME=""
if [ "$TORCH_CUDA" != "none" ] && command -v nvcc >/dev/null 2>&1; then
    NCCL_HOME="${HOROVOD_NCCL_HOME:-$("$PY" -c '
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
print(list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else "")' 2>/dev/null || true)}"
    if [ -n "$NCCL_HOME" ] && [ -e "$NCCL_HOME/include/nccl.h" ]; then
        VARIANT="cuda${TORCH_CUDA}-nccl"
    else
        log "torch is a CUDA build and nvcc is present, but no NCCL was found (pip nvidia-nccl-cu* or HOROVOD_NCCL_HOME): building CPU-only"
        NCCL_HOME=""
    fi
fi

KEY="horovod-${HOROVOD_VERSION}_torch-${TORCH_VERSION}_${PY_TAG}_${VARIANT}"
KEY="${KEY//+/-}"
CACHE_DIR="$CACHE_ROOT/$KEY"
WHEEL="$(ls "$CACHE_DIR"/horovod-"${HOROVOD_VERSION}"-*.whl 2>/dev/null | head -n1 || true)"

if [ -n "$WHEEL" ] && [ "${HOROVOD_REBUILD:-0}" != "1" ]; then
    log "cached wheel: $WHEEL"
else
    log "building horovod $HOROVOD_VERSION against torch $TORCH_VERSION ($PY_TAG, $VARIANT) with $JOBS jobs; about 6 minutes on 2 cores"
    start=$(date +%s)
    "$PY" -m pip install --quiet "cmake==$CMAKE_PIN"
    work="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
    trap 'rm -rf "$work"' EXIT

    # The wrapper compiler: every C++ compile gets -std=c++17 as its last flag.
    real_cxx="$(command -v "${CXX:-g++}" || command -v c++)"
    cat > "$work/cxx17" <<EOF
#!/bin/sh
exec "$real_cxx" "\$@" -std=c++17
EOF
    chmod +x "$work/cxx17"

    export CXX="$work/cxx17"
    export HOROVOD_CMAKE="$VENV/bin/cmake"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1
    export HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    export MAKEFLAGS="-j$JOBS"  # setup.py would otherwise run make -j8
    unset HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLGATHER
    if [ "$VARIANT" = cpu ]; then
        export HOROVOD_WITHOUT_NVTX=1
    else
        export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$NCCL_HOME" HOROVOD_NCCL_LINK=SHARED
        # pip's NCCL ships libnccl.so.2 only; the linker looks for libnccl.so
        if [ ! -e "$NCCL_HOME/lib/libnccl.so" ] && [ -e "$NCCL_HOME/lib/libnccl.so.2" ]; then
            mkdir -p "$work/nccl/lib"
            ln -s "$NCCL_HOME/include" "$work/nccl/include"
            ln -s "$NCCL_HOME/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so"
            export HOROVOD_NCCL_HOME="$work/nccl"
        fi
    fi

    # PyPI has 0.28.1 as a source release only; --no-binary makes that explicit, and no pip
    # cache, so a wheel pip built earlier against another torch is never reused.
    nice -n 10 "$PY" -m pip wheel --no-deps --no-build-isolation --no-cache-dir \
        --no-binary horovod "horovod==$HOROVOD_VERSION" -w "$work/wheel" >"$work/build.log" 2>&1 || {
        tail -n 60 "$work/build.log" >&2
        log "build failed (full log above was $work/build.log)"
        exit 1
    }
    built="$(ls "$work"/wheel/horovod-*.whl)"
    mkdir -p "$CACHE_DIR"
    cp "$built" "$CACHE_DIR/.tmp-$(basename "$built")"
    mv "$CACHE_DIR/.tmp-$(basename "$built")" "$CACHE_DIR/$(basename "$built")"  # atomic on one filesystem
    WHEEL="$CACHE_DIR/$(basename "$built")"
    log "built $WHEEL in $(( $(date +%s) - start )) s"
fi

# --no-deps for horovod itself (its torch extra would let pip touch torch); its plain
# requirements are installed (already satisfied in the lab's venv).
"$PY" -m pip install --quiet --no-deps --force-reinstall "$WHEEL"
"$PY" -m pip install --quiet cloudpickle psutil pyyaml packaging
"$PY" - <<'EOF'
import horovod.torch as hvd
assert hvd.gloo_built(), "horovod was built without gloo"
print(f"[build_horovod] horovod {__import__('horovod').__version__} installed: gloo={hvd.gloo_built()} "
      f"mpi={hvd.mpi_built()} nccl={hvd.nccl_built()}")
EOF
