#!/usr/bin/env bash
# Packs what runs rnnc's GPU checks on a machine that has an NVIDIA driver and PyTorch but not
# this project's toolchain (no LLVM 19): the built rnnc and rnnc_tests, the compiler library they
# load (codegen/CompilerLibrary.h), and every shared library these load beyond the C and C++
# runtimes (libLLVM and what it needs), xz-compressed.
#
#   scripts/gpu-bundle.sh [BUILD] [DIR]       # defaults: build, .gpu (ignore it in .git/info/exclude)
#
# There, DIR/build/tools/rnnc and DIR/build/tests/rnnc_tests are wrappers that unpack the libraries
# on first use and run the binaries with them, so that
#   bench/gpu --build DIR/build --skip-build
# runs on that machine. The tests read their fixtures from the source tree they were built in; a
# wrapper links that path to the tree it is in when the path is missing there.
set -euo pipefail
build=$(realpath "${1:-build}")
dir=${2:-.gpu}
source_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/build/tools" "$dir/build/tests" "$dir/stage"
for binary in tools/rnnc tests/rnnc_tests; do
  strip -o "$dir/bin/$(basename $binary)" "$build/$binary"
done
strip -o "$dir/stage/librnnc_compiler.so" "$build/codegen/librnnc_compiler.so"
# Every library ldd resolves, less glibc's, libstdc++ and libgcc (the other machine's are newer).
ldd "$dir/bin/rnnc" "$dir/bin/rnnc_tests" "$dir/stage/librnnc_compiler.so" | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so' |
  while read -r library; do
    cp -L "$library" "$dir/stage/$(basename "$library")"
  done
tar -C "$dir/stage" -cf - . | xz -T0 -6 >"$dir/libs.tar.xz"
rm -rf "$dir/stage"

for binary in rnnc rnnc_tests; do
  where=$([ "$binary" = rnnc ] && echo tools || echo tests)
  cat >"$dir/build/$where/$binary" <<EOF
#!/usr/bin/env bash
bundle=\$(cd "\$(dirname "\$0")/../.." && pwd)
if [ ! -d "\$bundle/lib" ]; then
  mkdir -p "\$bundle/lib.partial" && xz -dc "\$bundle/libs.tar.xz" | tar -C "\$bundle/lib.partial" -xf - &&
    mv "\$bundle/lib.partial" "\$bundle/lib" 2>/dev/null || true
fi
if [ ! -e "$source_dir" ]; then
  mkdir -p "\$(dirname "$source_dir")" 2>/dev/null && ln -s "\$(dirname "\$bundle")" "$source_dir" 2>/dev/null || true
fi
export RNNC_COMPILER_LIBRARY="\$bundle/lib/librnnc_compiler.so"
LD_LIBRARY_PATH="\$bundle/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$bundle/bin/$binary" "\$@"
EOF
  chmod +x "$dir/build/$where/$binary"
done
du -sh "$dir" | awk '{print "gpu-bundle: " $1 " in " $2}'
