#!/usr/bin/env bash
# ThreadSanitizer (clang-19) over the tests that start threads: the thread team, multi-threaded
# kernels, concurrent API calls and compiles, concurrent cache writers and file readers (the list
# is in tests/CMakeLists.txt under RNNC_TSAN). One unity build of the library and those tests in
# build-tsan/; any report fails the test that caused it. scripts/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${RNNC_TSAN_BUILD:-build-tsan}

mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DRNNC_TSAN=ON -DCMAKE_UNITY_BUILD=ON \
  > "$build/configure.log"
cmake --build "$build" --target rnnc_tests
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
(cd "$build" && ctest --output-on-failure -j "$(nproc)")
