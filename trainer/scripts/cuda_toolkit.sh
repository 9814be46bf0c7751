#!/usr/bin/env bash
# Make a CUDA toolkit and NCCL available to `make cuda`, and describe them in a make fragment.
#
# Usage: trainer/scripts/cuda_toolkit.sh OUT.mk
#
# If CUDA_HOME (or the nvcc on PATH) names an installed toolkit that has cuBLAS and NCCL is
# found next to it or in the system's include path, that toolkit is used. Otherwise the
# pinned CUDA 13 wheels from PyPI are downloaded and unpacked into a cache OUTSIDE the
# repository, ${CIRRUS_CACHE:-$HOME/.cache/cirrus}/cuda-$CUDA_VERSION, once: a second run finds
# the stamp file and does nothing. The wheels are unpacked as zip files (they are), not
# pip-installed, so no Python environment is touched.
#
# What the wheels lack, this adds in the cache (never in the repository): the unversioned
# libcudart.so / libcublas.so / libcublasLt.so / libnccl.so links the linker looks for, and
# the executable bits of nvcc and its helpers (zip extraction drops them).
#
# OUT.mk defines NVCC, CUDA_INC, CUDA_LIBDIR, NCCL_INC, NCCL_LIBDIR for trainer/model/cuda/cuda.mk.
set -euo pipefail

out=${1:?usage: cuda_toolkit.sh OUT.mk}

# Pinned: one CUDA release (13.0 update 2) whose headers agree with each other. cuBLAS 13.1
# needs the 13.1 runtime headers (cudaEmulation* types), so cuBLAS stays at 13.0.
CUDA_VERSION=13.0.88
WHEELS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.88
    nvidia-cuda-cccl==13.0.85
    nvidia-cublas==13.0.2.14
    nvidia-nccl-cu13==2.28.9
)

say() { echo "cirrus: cuda: $*"; }

write_mk() { # NVCC CUDA_INC CUDA_LIBDIR NCCL_INC NCCL_LIBDIR
    mkdir -p "$(dirname "$out")"
    {
        echo "# Written by trainer/scripts/cuda_toolkit.sh; do not edit."
        echo "NVCC        := $1"
        echo "CUDA_INC    := $2"
        echo "CUDA_LIBDIR := $3"
        echo "NCCL_INC    := $4"
        echo "NCCL_LIBDIR := $5"
    } > "$out.tmp"
    mv "$out.tmp" "$out"
}

# ---- an installed toolkit ----
home=${CUDA_HOME:-}
if [ -z "$home" ] && command -v nvcc >/dev/null 2>&1; then
    home=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
fi
if [ -n "$home" ] && [ -x "$home/bin/nvcc" ] && [ -f "$home/include/cublas_v2.h" ]; then
    nccl_inc="" nccl_lib=""
    for d in "${NCCL_HOME:-}" "$home" /usr; do
        [ -n "$d" ] && [ -f "$d/include/nccl.h" ] || continue
        nccl_inc=$d/include
        for l in "$d/lib64" "$d/lib" "$d/lib/$(uname -m)-linux-gnu"; do
            [ -e "$l/libnccl.so" ] && { nccl_lib=$l; break; }
        done
        [ -n "$nccl_lib" ] && break
    done
    if [ -n "$nccl_lib" ]; then
        libdir=$home/lib64
        [ -d "$libdir" ] || libdir=$home/lib
        say "using the installed toolkit in $home (NCCL: $nccl_inc)"
        write_mk "$home/bin/nvcc" "$home/include" "$libdir" "$nccl_inc" "$nccl_lib"
        exit 0
    fi
    say "toolkit in $home has no NCCL (set NCCL_HOME); using the PyPI wheels instead"
fi

# ---- the PyPI wheels, cached ----
cache=${CIRRUS_CACHE:-${HOME:?set HOME or CIRRUS_CACHE}/.cache/cirrus}/cuda-$CUDA_VERSION
root=$cache/root
cu=$root/nvidia/cu13
nccl=$root/nvidia/nccl
stamp=$cache/complete
want=$(printf '%s\n' "${WHEELS[@]}")
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    say "toolkit cached in $cache"
else
    py=${PYTHON:-python3}
    if ! "$py" -m pip --version >/dev/null 2>&1; then
        echo "cirrus: cuda: no CUDA toolkit and no pip to fetch one ($py -m pip):" \
            "install python3-pip or set CUDA_HOME" >&2
        exit 1
    fi
    say "fetching CUDA $CUDA_VERSION + NCCL wheels (~700 MB) into $cache"
    rm -rf "$root" "$stamp"
    mkdir -p "$cache/wheels" "$root"
    # --no-deps: the list above is the whole toolkit; --only-binary: never build anything.
    # The wheels are for this machine's platform (they hold its compiler and libraries).
    "$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$cache/wheels" "${WHEELS[@]}"
    for w in "${WHEELS[@]}"; do
        name=${w%%==*} ver=${w##*==}
        f=$(ls "$cache/wheels/${name//-/_}-$ver-"*.whl)
        say "unpacking $(basename "$f")"
        "$py" -m zipfile -e "$f" "$root"
    done
    chmod +x "$cu"/bin/* "$cu"/nvvm/bin/*
    ln -sf libcudart.so.13 "$cu/lib/libcudart.so"
    ln -sf libcublas.so.13 "$cu/lib/libcublas.so"
    ln -sf libcublasLt.so.13 "$cu/lib/libcublasLt.so"
    ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"
    # The wheels are no longer needed once unpacked.
    rm -rf "$cache/wheels"
    echo "$want" > "$stamp"
    say "toolkit ready in $cache"
fi
write_mk "$cu/bin/nvcc" "$cu/include" "$cu/lib" "$nccl/include" "$nccl/lib"
