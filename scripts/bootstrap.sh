#!/usr/bin/env bash
# The README's first command: installs what is missing, builds rnnc (Release, in build/) and runs
# the main job, `rnnc bench` on the built-in LSTM at the fastrnns default size.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --target rnnc
build/tools/rnnc bench "$@"
