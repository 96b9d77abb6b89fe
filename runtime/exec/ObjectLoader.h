// Loads the code generator's object files (ELF relocatable, x86-64) into this process by itself:
// maps their sections, resolves their symbols, applies their relocations and protects the pages
// (code read+execute, the rest read-only), as a static linker and a dynamic loader would, for the
// few relocation kinds LLVM's x86-64 back end emits (the large code model's GOT-relative ones,
// and the small model's). No LLVM: a kernel from the disk cache is loaded in microseconds
// without LLVM's JIT linker, and what runs generated code need not link LLVM at all (issue 19).
// Anything else in an object (another machine, a relocation kind not handled, a symbol nothing
// defines) is refused with an error, never loaded half-way.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rnnc {

// An entry point of loaded code; the code stays mapped while `lifetime` (or a copy) is held.
struct LoadedFunction {
  void* address = nullptr;
  std::shared_ptr<void> lifetime;
};

// The external functions generated code may call, by name. A name not among them is looked up
// in the process (memcpy, memset).
using ExternalSymbols = std::vector<std::pair<std::string, void*>>;

// Loads `object` and returns the address of its defined function `function`. Throws
// InternalError for an object it cannot load (what and why in the message). A bundle of objects
// (codegen/ObjectBundle.h) loads part after part, each part's calls to a global function of an
// earlier part resolved to it.
LoadedFunction loadObject(std::string_view object, const std::string& function,
                          const ExternalSymbols& symbols);

// loadObject with the runtime's helpers (rnnc_gemm, rnnc_layernorm, rnnc_layernorm_grad,
// rnnc_barrier): how every compiled cell, the GEMM tile and the GPU emulation are loaded.
LoadedFunction loadGeneratedCode(std::string_view object, const std::string& function);

} // namespace rnnc
