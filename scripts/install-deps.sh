#!/usr/bin/env bash
# Installs every Debian package that sluice's build, tests and benchmarks need.
# Idempotent: quiet and quick when everything is already present. Uses sudo when not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas-dev          # GEMM through CBLAS
  libhwy-dev               # Google Highway: runtime-dispatched SIMD row kernels
  libdnnl-dev              # oneDNN: bf16 matmul (fp32 accumulation), fp32 GEMM where it beats OpenBLAS
  librandom123-dev         # Random123: Philox, the counter-based generator of dropout's masks
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libreaderwriterqueue-dev # bounded SPSC queue for the async GC
  openmpi-bin libopenmpi-dev # MPI Communicator backend (comm/mpi.h) and mpirun for its tests
  clang libclang-rt-14-dev clang-format # make fuzz; thread-safety and format checks of make test
  python3 python3-torch    # independent reference for parity tests and benchmarks
)
# Wanted but not required: when one cannot be installed (no such package for this machine, no
# network), the tests that need it say so and are skipped.
OPTIONAL=(
  chromium                 # headless browser of the report's browser test (tests/report)
)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
optional=()
for p in "${OPTIONAL[@]}"; do installed "$p" || optional+=("$p"); done
[ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq || [ ${#missing[@]} -eq 0 ]
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
for p in "${optional[@]}"; do
  echo "install-deps: installing $p (optional)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null ||
    echo "install-deps: warning: could not install $p; the tests that need it will be skipped" >&2
done
