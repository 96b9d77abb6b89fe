#!/usr/bin/env bash
# The README's second command (and CI's): installs what is missing, builds everything and runs
# every test twice: in the Release build (build/) and built with AddressSanitizer and
# UndefinedBehaviorSanitizer (build-asan/); then the libFuzzer harnesses for a bounded time
# (RNNC_FUZZ_SECONDS each, 30 by default; tests/fuzz/run-libfuzzer 600 for a long run).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
scripts/install-deps.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")

# Sanitizers: -O1 keeps the build quick and the stacks readable. Leaks count as failures.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRNNC_SANITIZE=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g"
cmake --build build-asan -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && ctest --output-on-failure -j "$jobs")

# The parsers and readers under libFuzzer (clang-19, build-fuzz/), from the seed corpus.
if command -v clang++-19 > /dev/null; then
  RNNC_FUZZ_SECONDS=${RNNC_FUZZ_SECONDS:-30} tests/fuzz/run-libfuzzer
else
  echo "test.sh: clang++-19 is missing: the libFuzzer harnesses did not run" >&2
  exit 1
fi
