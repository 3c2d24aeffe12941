#!/usr/bin/env bash
# Build Horovod 0.28.1 from PyPI's source release against the torch installed in the venv, cache
# the wheel outside the repository, and install it into the venv.  (`make horovod` runs this.)
#
#   scripts/build_horovod.sh [--check] [VENV]   VENV defaults to <repo>/.venv
#
#   --check   decide the build variant only (prints `variant=cpu` or `variant=cuda<ver>-nccl`),
#             build and install nothing; the refusal below applies (exit 3).
#
# - Frameworks: PyTorch only (HOROVOD_WITH_PYTORCH=1, WITHOUT TensorFlow/MXNet); controller and
#   CPU collectives: gloo (HOROVOD_WITH_GLOO=1, HOROVOD_WITHOUT_MPI=1).  Where torch is a CPU
#   build: a CPU build.  Where torch is a CUDA build: NCCL for GPU tensors, which needs nvcc
#   and an NCCL (pip's nvidia-nccl-cu* or $HOROVOD_NCCL_HOME); if either is missing the script
#   REFUSES (exit 3, one line naming what is missing) rather than build a CPU-only Horovod that
#   GPU workers could not use (the lab refuses backend horovod + workers.use_gpu without NCCL
#   too).  SCALING_HOROVOD_CPU_ONLY=1 builds CPU-only on purpose.
#   For tests of that decision without a GPU (tests/test_gpu_path.py): SCALING_HOROVOD_TORCH_CUDA
#   stands in for torch.version.cuda ("none": a CPU build) and SCALING_HOROVOD_NVCC for the nvcc
#   found on PATH ("" : none).
# - C++17: torch >= 2.1's headers need it, but Horovod 0.28.1's CMake sets CXX_STANDARD 14
#   (fixed upstream after 0.28.1, unreleased).  A compiler wrapper appends -std=c++17 after
#   every other flag, so the last -std wins.
# - One source patch (PATCH_LEVEL 1): Horovod 0.28.1 creates the gloo device of every process
#   set (the global one included, which carries all collectives) with an empty interface name
#   instead of HOROVOD_GLOO_IFACE (GlooContext::InitializeForProcessSet never copies
#   gloo_iface_ from the global context), so gloo falls back to resolving the hostname: on hosts
#   where it resolves to 127.0.x.x (Debian's default, and every node of the lab's minicluster)
#   each rank advertises loopback and a multi-node job dies in `connect [127.0.0.1]`. The patch
#   copies the interface over.
# - Cache: ${SCALING_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaling/wheels}/<key>/, the
#   key being horovod version + patch level + torch version + CPython tag + cpu/cuda variant,
#   so another torch (or python, or a GPU machine) builds its own wheel.  With the wheel cached
#   this takes seconds.  HOROVOD_REBUILD=1 ignores the cache.
# - Build tools: cmake from PyPI, pinned below (<4: CMake 4 refuses gloo's old
#   cmake_minimum_required), installed into the venv only when a build is needed; a C++
#   compiler (g++ >= 9 for C++17) must be on PATH.
set -euo pipefail

HOROVOD_VERSION=0.28.1
PATCH_LEVEL=1  # bump whenever the source patch below changes: it is part of the cache key
CMAKE_PIN=3.31.10

usage() {
    cat <<'USAGE'
usage: scripts/build_horovod.sh [--check] [VENV]

Build Horovod 0.28.1 (PyTorch, gloo; NCCL where torch is a CUDA build) against the torch of the
venv, cache the wheel outside the repository and install it into the venv (`make horovod`).

positional arguments:
  VENV        the virtual environment to install into (default: <repo>/.venv)

options:
  -h, --help  show this help and exit
  --check     decide the build variant only (prints variant=cpu or variant=cuda<ver>-nccl);
              build and install nothing

exit status: 0 built (or cached) and installed, 2 bad arguments or no venv, 3 refused
(a CUDA torch without nvcc or NCCL: SCALING_HOROVOD_CPU_ONLY=1 builds CPU-only on purpose)
USAGE
}

CHECK_ONLY=0
VENV_ARG=""
for arg in "$@"; do
    case "$arg" in
        -h|--help) usage; exit 0 ;;
        --check) CHECK_ONLY=1 ;;
        -*) echo "build_horovod.sh: unknown option $arg (see scripts/build_horovod.sh --help)" >&2; exit 2 ;;
        *)
            [ -z "$VENV_ARG" ] || { echo "build_horovod.sh: one VENV at most, got $VENV_ARG and $arg" >&2; exit 2; }
            VENV_ARG="$arg" ;;
    esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "${VENV_ARG:-$REPO/.venv}" 2>/dev/null && pwd)" || { echo "build_horovod.sh: no venv at ${VENV_ARG:-$REPO/.venv} (make install first)" >&2; exit 2; }
PY="$VENV/bin/python"
CACHE_ROOT="${SCALING_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaling/wheels}"
JOBS="${HOROVOD_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"

log() { echo "[build_horovod] $*" >&2; }

[ -x "$PY" ] || { log "no python at $PY (make install first)"; exit 2; }

# What the wheel depends on: torch's exact version (the extension links libtorch), the
# interpreter, and whether GPU operations are compiled in. Read from torch/version.py, the file torch
# itself takes them from, without importing torch (seconds of CPU).
read -r TORCH_VERSION TORCH_CUDA PY_TAG < <("$PY" -c '
import importlib.util, os, runpy, sys
version = runpy.run_path(os.path.join(os.path.dirname(importlib.util.find_spec("torch").origin), "version.py"))
print(version["__version__"], version["cuda"] or "none", f"cp{sys.version_info[0]}{sys.version_info[1]}")')

TORCH_CUDA="${SCALING_HOROVOD_TORCH_CUDA:-$TORCH_CUDA}"

refuse() {
    log "REFUSED: $*"
    exit 3
}

# Sets VARIANT (cpu | cuda<ver>-nccl) and NCCL_HOME, or refuses: a CUDA torch gets NCCL or nothing.
choose_variant() {
    VARIANT=cpu
    NCCL_HOME=""
    [ "$TORCH_CUDA" = "none" ] && return 0
    if [ "${SCALING_HOROVOD_CPU_ONLY:-0}" = "1" ]; then
        log "torch is a CUDA $TORCH_CUDA build; SCALING_HOROVOD_CPU_ONLY=1: building CPU-only on purpose (no NCCL, GPU workers cannot use it)"
        return 0
    fi
    local nvcc
    if [ -n "${SCALING_HOROVOD_NVCC+set}" ]; then nvcc="$SCALING_HOROVOD_NVCC"; else nvcc="$(command -v nvcc || true)"; fi
    if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
        refuse "torch $TORCH_VERSION is a CUDA $TORCH_CUDA build but nvcc is not on PATH: Horovod would build without NCCL and GPU workers could not use it; install the CUDA toolkit (nvcc on PATH), or set SCALING_HOROVOD_CPU_ONLY=1 for a CPU-only build on purpose"
    fi
    NCCL_HOME="${HOROVOD_NCCL_HOME:-$("$PY" -c '
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
print(list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else "")' 2>/dev/null || true)}"
    if [ -z "$NCCL_HOME" ] || [ ! -e "$NCCL_HOME/include/nccl.h" ]; then
        refuse "torch $TORCH_VERSION is a CUDA $TORCH_CUDA build and nvcc is at $nvcc, but no NCCL was found (pip nvidia-nccl-cu* in the venv, or HOROVOD_NCCL_HOME with include/nccl.h): Horovod would build without NCCL; install one, or set SCALING_HOROVOD_CPU_ONLY=1 for a CPU-only build on purpose"
    fi
    VARIANT="cuda${TORCH_CUDA}-nccl"
}

choose_variant
if [ "$CHECK_ONLY" = 1 ]; then
    echo "variant=$VARIANT"
    exit 0
fi

KEY="horovod-${HOROVOD_VERSION}-p${PATCH_LEVEL}_torch-${TORCH_VERSION}_${PY_TAG}_${VARIANT}"
KEY="${KEY//+/-}"
CACHE_DIR="$CACHE_ROOT/$KEY"
WHEEL="$(ls "$CACHE_DIR"/horovod-"${HOROVOD_VERSION}"-*.whl 2>/dev/null | head -n1 || true)"

if [ -n "$WHEEL" ] && [ "${HOROVOD_REBUILD:-0}" != "1" ]; then
    log "cached wheel: $WHEEL"
else
    log "building horovod $HOROVOD_VERSION against torch $TORCH_VERSION ($PY_TAG, $VARIANT) with $JOBS jobs (5-8 CPU-minutes: 4.5 to 20 minutes on 2 cores, depending on load)"
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

    # PyPI has 0.28.1 as a source release only. Built from our patched copy of it, with no pip
    # cache, so a wheel pip built earlier (against another torch) is never reused.
    "$PY" -m pip download --quiet --no-deps --no-binary :all: --no-cache-dir "horovod==$HOROVOD_VERSION" -d "$work/sdist"
    tar xzf "$work/sdist/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    "$PY" - "$src/horovod/common/gloo/gloo_context.cc" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
anchor = """  assert(global_context.IsEnabled());
"""
fix = anchor + """
  // scaling lab patch 1: use the global context's interface (HOROVOD_GLOO_IFACE), not an empty one
  gloo_iface_ = global_context.gloo_iface_;
"""
if text.count(anchor) != 1 or "InitializeForProcessSet" not in text:
    sys.exit("build_horovod: the gloo_iface patch does not apply to this source")
open(path, "w").write(text.replace(anchor, fix))
PATCH
    nice -n 10 "$PY" -m pip wheel --no-deps --no-build-isolation --no-cache-dir "$src" -w "$work/wheel" \
        >"$work/build.log" 2>&1 || {
        mkdir -p "$CACHE_ROOT"
        cp "$work/build.log" "$CACHE_ROOT/$KEY.build.log"
        tail -n 60 "$work/build.log" >&2
        log "build failed; full log: $CACHE_ROOT/$KEY.build.log"
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
EXPECT_NCCL=$([ "$VARIANT" = cpu ] && echo 0 || echo 1) "$PY" - <<'EOF'
import os
import horovod.torch as hvd
assert hvd.gloo_built(), "horovod was built without gloo"
assert hvd.nccl_built() or os.environ["EXPECT_NCCL"] == "0", "horovod was built without NCCL although the build asked for it"
print(f"[build_horovod] horovod {__import__('horovod').__version__} installed: gloo={hvd.gloo_built()} "
      f"mpi={hvd.mpi_built()} nccl={hvd.nccl_built()}")
EOF
