// The target the JIT compiles for (codegen::runnableTarget: LLVM's name for the CPU, its
// features, the host's caches), remembered in the disk cache so that a process whose kernels are
// all cached never loads the compiler library and LLVM (codegen/CompilerLibrary.h): the entry (a
// `.target` file beside the code, which `rnnc cache ls` and the hit counts leave out) is
// keyed by what CPUID says of this machine (vendor, family, model, stepping, every feature leaf,
// what the OS enables in XCR0), the CPU name asked for and the rnnc and LLVM versions, so another
// machine, a VM given other features or a new rnnc asks LLVM again. Within a process, once per
// CPU name.
#pragma once

#include "codegen/Target.h"
#include "runtime/exec/CompileCache.h"

#include <optional>
#include <string>

namespace rnnc {

// codegen::runnableTarget(cpu) ("" is the host), from `cache` when it has been asked before;
// the same UserErrors for a CPU this machine cannot run or LLVM does not know.
codegen::Target runnableTarget(const std::string& cpu, const CacheOptions& cache);

// The disk cache's part of runnableTarget (no memo in the process): the entry for `cpu` when
// there is a valid one, else LLVM's answer, stored.
codegen::Target rememberedTarget(const std::string& cpu, const CacheOptions& cache);
// Its key: rnnc (with the code generator's digest), LLVM, the CPU name and cpuSignature().
std::string targetMemoKey(const std::string& cpu);

// What CPUID and XGETBV say of this CPU, as text: the same on every core of a machine, for the
// memo's key (no core number: the APIC ID is left out).
std::string cpuSignature();

// A Target as text and back (nullopt for text that is not one).
std::string targetText(const codegen::Target& target);
std::optional<codegen::Target> parseTargetText(const std::string& text);

} // namespace rnnc
