#!/usr/bin/env bash
# setup.sh -- install the Debian 12 packages this project builds with (idempotent).
#
#   scripts/setup.sh                 everything the build, the tests and CI need
#   scripts/setup.sh --chromium      also chromium (headless rendering of reports)
#
# Runs apt-get only when a package is missing (then `apt-get update` first). Needs root or
# sudo. nvcc (CUDA 13) is not a Debian package: it is expected at /usr/local/cuda/bin/nvcc
# (scripts/build-device.sh says so if it is not there).
set -euo pipefail

with_chromium=0
for arg in "$@"; do
  case "$arg" in
    --chromium) with_chromium=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

packages=(
  # toolchain
  build-essential g++ cmake ninja-build pkg-config git ca-certificates file
  # libraries (header-only ones too)
  libhdf5-dev hdf5-tools libaec-dev zlib1g-dev
  libeigen3-dev doctest-dev nlohmann-json3-dev libcli11-dev
  libomp-dev
  # boost.context: fibers for the host emulation's warp kernels (device/simt.hpp)
  libboost-context-dev
  # scripts/same-sass.sh reads the sm_90 cubins' sections
  python3-pyelftools
  # fuzzing (scripts/fuzz.sh): clang and its libFuzzer / sanitizer runtimes (libclang_rt.fuzzer;
  # only a Recommends of clang, which --no-install-recommends skips)
  clang libclang-rt-14-dev
  # the Python module k4 (python/): pybind11 builds it against Debian's python3, numpy holds
  # its tensors, pytest runs its tests from ctest, h5py reads goldens in the README's example
  pybind11-dev python3-pybind11 python3-dev python3-numpy python3-pytest python3-h5py
  # AMD device compiler (Debian's HIP 5.2, clang-15 based): scripts/build-amd.sh
  hipcc
)
if [[ $with_chromium == 1 ]]; then
  packages+=(chromium)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup.sh: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then sudo=(sudo); else echo "setup.sh: need root or sudo" >&2; exit 1; fi
fi

echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"

# Check that what the build needs is now there.
for tool in cmake ninja g++ hipcc h5dump; do
  command -v "$tool" >/dev/null || { echo "setup.sh: '$tool' still missing after install" >&2; exit 1; }
done
echo "setup.sh: done"
