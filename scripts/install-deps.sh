#!/usr/bin/env bash
# Installs the Debian packages rnnc needs, only those missing. Safe to run repeatedly.
set -euo pipefail

packages=(cmake g++ ninja-build make llvm-19-dev libzstd-dev zlib1g-dev libeigen3-dev libgtest-dev
          libbenchmark-dev nlohmann-json3-dev libcli11-dev libfmt-dev nettle-dev pkgconf
          pybind11-dev python3-dev python3-numpy python3-pytest python3-torch python3-matplotlib
          clang-19 libclang-rt-19-dev)

# For the comparisons only (bench/compare), best effort: the build and the tests need neither.
# oneDNN; and an optimised BLAS, because Debian's python3-torch runs its fp32 GEMMs on whatever
# libblas.so.3 is, the netlib reference where nothing else is installed (about 2.6 GFLOP/s on a
# Zen 4 core: PyTorch's LSTM 40 times slower than it is with OpenBLAS).
optional=(libdnnl-dev libopenblas0-pthread)

missingOf() {
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      echo "$p"
    fi
  done
}
mapfile -t missing < <(missingOf "${packages[@]}")
mapfile -t missingOptional < <(missingOf "${optional[@]}")
[ ${#missing[@]} -eq 0 ] && [ ${#missingOptional[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -q || [ ${#missing[@]} -eq 0 ]
if [ ${#missing[@]} -gt 0 ]; then
  echo "Installing: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ ${#missingOptional[@]} -gt 0 ]; then
  echo "Installing (for bench/compare only): ${missingOptional[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
    "${missingOptional[@]}" || echo "install-deps: could not install ${missingOptional[*]}:" \
    "bench/compare will lack oneDNN or time PyTorch on the reference BLAS" >&2
fi
