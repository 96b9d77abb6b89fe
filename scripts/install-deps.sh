#!/usr/bin/env bash
# Installs the Debian packages rnnc needs, only those missing. Safe to run repeatedly.
set -euo pipefail

packages=(cmake g++ ninja-build make llvm-19-dev libzstd-dev zlib1g-dev libeigen3-dev libgtest-dev
          libbenchmark-dev nlohmann-json3-dev libcli11-dev libfmt-dev nettle-dev pkgconf
          pybind11-dev python3-dev python3-numpy python3-pytest python3-torch python3-matplotlib
          clang-19 libclang-rt-19-dev)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "Installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
