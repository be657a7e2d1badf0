#!/usr/bin/env bash
# Installs every Debian package that sluice's build, tests and benchmarks need.
# Idempotent: quiet and quick when everything is already present. Uses sudo when not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas-dev          # GEMM through CBLAS
  libhwy-dev               # Google Highway: runtime-dispatched SIMD row kernels
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libreaderwriterqueue-dev # bounded SPSC queue for the async GC
  openmpi-bin libopenmpi-dev # MPI Communicator backend (comm/mpi.h) and mpirun for its tests
  clang libclang-rt-14-dev clang-format # make fuzz; thread-safety and format checks of make test
  python3 python3-torch    # independent reference for parity tests and benchmarks
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
