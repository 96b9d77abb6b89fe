// perf's jitdump file for generated code (RNNC_PERF_JITDUMP=1): each loaded function's name,
// address, and its code bytes as loaded, with the time it was loaded. `perf inject --jit` turns
// the records into small ELF files beside a profile, so that `perf annotate` shows the hot
// instructions of a kernel and `perf report` names the kernel that ran at an address at the
// time of each sample: the perf map (RNNC_PERF_MAP, /tmp/perf-PID.map) cannot tell apart two
// kernels loaded at one address one after the other, as `rnnc bench` does with the fp32 and fp16
// variants of a cell. The format is perf's (tools/perf/Documentation/jitdump-specification.txt),
// written to /tmp/jit-PID.dump and mapped executable once, which is how perf finds it:
//   RNNC_PERF_JITDUMP=1 perf record -k mono -o perf.data -- rnnc bench ...
//   perf inject --jit -i perf.data -o perf.jit.data && perf annotate -i perf.jit.data
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rnnc {

// Whether RNNC_PERF_JITDUMP asks for the dump (set, and not "0").
bool perfJitDumpRequested();

// Appends a code-load record for `size` bytes of code at `code`, named `name`. Best effort: a
// dump that cannot be written is reported on stderr once and never fails a load.
void recordPerfJitCodeLoad(std::string_view name, const void* code, uint64_t size);

// The path of this process's dump file.
std::string perfJitDumpPath();

} // namespace rnnc
