#!/usr/bin/env bash
# The README's second command (and CI's): installs what is missing, builds everything and runs
# every test twice: in the Release build (build/) and built with AddressSanitizer and
# UndefinedBehaviorSanitizer (build-asan/); the tests that start threads under ThreadSanitizer
# (build-tsan/, scripts/tsan.sh); then the libFuzzer harnesses for a bounded time
# (RNNC_FUZZ_SECONDS each, 15 by default; tests/fuzz/run-libfuzzer 600 for a long run).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)

# Each stage's wall time, printed as it ends and together at the end: CI has 25 minutes on 2
# cores, and this says which stage to look at when a change brings it near.
stage_times=()
stage() { # stage NAME COMMAND...: runs the command, then records how long it took
  local name=$1 start=$SECONDS
  shift
  "$@"
  stage_times+=("$(printf '%5d s  %s' $((SECONDS - start)) "$name")")
  echo "test.sh: $name took $((SECONDS - start)) s"
}
report_stages() {
  echo "test.sh: stage times (${SECONDS} s in all)"
  printf '  %s\n' "${stage_times[@]}"
}
trap report_stages EXIT

stage "dependencies" scripts/install-deps.sh

# In CI (a fresh clone, every file built once) the Release build is a unity build too: sources
# compiled in batches parse CLI11, gtest, fmt and LLVM's headers once a batch and emit their inline
# functions once, 234 s against 374-400 s on the Intel VM's 2 cores. A developer's build/ stays
# one object per source, for quick rebuilds.
unity=OFF
if [[ "${CI:-}" == true ]]; then
  unity=ON
fi
stage "release configure" cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_UNITY_BUILD="$unity"
stage "release build" cmake --build build -j "$jobs"
stage "release tests" ctest --test-dir build --output-on-failure -j "$jobs"

# Sanitizers: -O0 with line tables only builds in half the time of -O1 -g (197 s against 449 s
# on 2 cores), the tests take longer by less than that; stacks still name files and lines. A
# unity build (sources compiled in batches) halves the time again. The gtest cases run in one
# process per core (scripts/run-gtest-shards), the other tests under ctest. Leaks count as
# failures.
stage "sanitizer configure" cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRNNC_SANITIZE=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1" -DCMAKE_UNITY_BUILD=ON
stage "sanitizer build" cmake --build build-asan -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
stage "sanitizer tests (ctest)" ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE gtest
stage "sanitizer tests (gtest shards)" scripts/run-gtest-shards build-asan "$jobs"

# Clang-19 stages: the threaded tests under ThreadSanitizer (build-tsan/), then the parsers and
# readers under libFuzzer (build-fuzz/) from the seed corpus.
if ! command -v clang++-19 > /dev/null; then
  echo "test.sh: clang++-19 is missing: ThreadSanitizer and libFuzzer did not run" >&2
  exit 1
fi
stage "ThreadSanitizer build and tests" scripts/tsan.sh
stage "libFuzzer build and runs" env RNNC_FUZZ_SECONDS="${RNNC_FUZZ_SECONDS:-15}" \
  tests/fuzz/run-libfuzzer
