#!/usr/bin/env bash
# Installs the Debian packages llmt builds with (only those missing) and builds into build/.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#   LLMT_CUDA=AUTO|ON|OFF (default AUTO: the CUDA backend is built when nvcc is found)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config libdnnl-dev libboost-context-dev openmpi-bin libopenmpi-dev
          libhdf5-openmpi-dev nlohmann-json3-dev libyaml-cpp-dev googletest libgtest-dev libibverbs-dev
          iproute2 openssh-server openssh-client slurm-wlm munge)  # the last five: the cluster tests (tests/cluster)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  as_root=(env DEBIAN_FRONTEND=noninteractive)  # through env: sudo would drop the variable
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: run as root or install sudo to install: ${missing[*]}" >&2; exit 1; }
    as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
  fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# nvcc lives outside PATH in the usual CUDA install
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# cudnn-frontend's headers (header-only C++; the GPU build's cuDNN attention, kernels/cuda/cudnn_attention.cpp)
# where nvcc is. Pinned, as the code is written against its API. Without them that build runs the other
# attention kernels and says so; the emulated build needs nothing (its cuDNN is a stand-in).
frontend=.deps/cudnn-frontend
if command -v nvcc >/dev/null 2>&1 && [ "${LLMT_CUDA:-AUTO}" != OFF ] && [ ! -f "$frontend/include/cudnn_frontend.h" ]; then
  python3 -m pip install -q --no-deps --target "$frontend" nvidia-cudnn-frontend==1.32.0 >/dev/null 2>&1 ||
    echo "setup: could not pip install nvidia-cudnn-frontend==1.32.0; the GPU build will have no cuDNN attention"
fi
cmake -S . -B build -G Ninja -DLLMT_CUDA="${LLMT_CUDA:-AUTO}" >/dev/null
ninja -C build
echo "setup: built build/bin/llmt"
