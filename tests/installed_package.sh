#!/usr/bin/env bash
# Installs the build into a scratch prefix, then configures, builds and runs examples/cpp_app
# against it alone: what an application outside the tree does with find_package(rnnc).
# Usage: installed_package.sh CMAKE BUILD_DIR SOURCE_DIR SCRATCH_DIR
set -euo pipefail
cmake=$1 build=$2 source=$3 scratch=$4
rm -rf "$scratch"
"$cmake" --install "$build" --prefix "$scratch/prefix" > "$scratch.install.log"
"$cmake" -S "$source/examples/cpp_app" -B "$scratch/app" -G Ninja \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release > "$scratch.configure.log"
"$cmake" --build "$scratch/app" > "$scratch.build.log"
RNNC_CACHE_DIR="$scratch/cache" "$scratch/app/cpp_app"
