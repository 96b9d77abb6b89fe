// A small wrapper around LLVM ORC's LLJIT (after LLVM's BuildingAJIT, chapter 1): created with
// the runtime helpers the generated code calls, it loads compiled object files and hands back
// function addresses. Each loaded object lives in its own JITDylib, freed when the last handle
// to it goes. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rnnc::codegen {

class Jit {
public:
  // `symbols`: name and address of every external function generated code may call.
  explicit Jit(const std::vector<std::pair<std::string, void*>>& symbols);
  ~Jit();
  Jit(const Jit&) = delete;
  Jit& operator=(const Jit&) = delete;

  struct Loaded {
    void* address = nullptr;
    std::shared_ptr<void> lifetime; // the code stays loaded while this is held
  };
  Loaded load(const std::string& objectFile, const std::string& functionName);

private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

} // namespace rnnc::codegen
