#include "codegen/LLVMHostTarget.h"

#include "codegen/LLVMHeaders.h"
#include "ir/Error.h"

#include <algorithm>

namespace rnnc::codegen {

HostTarget llvmHostTarget() {
  HostTarget target;
  target.triple = llvm::sys::getProcessTriple();
  target.cpu = llvm::sys::getHostCPUName().str();
  for (const auto& entry : llvm::sys::getHostCPUFeatures())
    if (entry.second)
      target.features.push_back(entry.first().str());
  std::sort(target.features.begin(), target.features.end());
  return target;
}

HostTarget llvmNamedX86Target(const std::string& cpu) {
  if (llvm::X86::parseArchX86(cpu, /*Only64Bit=*/true) == llvm::X86::CK_None) {
    llvm::SmallVector<llvm::StringRef, 64> known;
    llvm::X86::fillValidCPUArchList(known, /*Only64Bit=*/true);
    std::string list;
    for (llvm::StringRef name : known)
      list += (list.empty() ? "" : ", ") + name.str();
    throw UserError("unknown x86-64 CPU '" + cpu +
                    "'; LLVM " LLVM_VERSION_STRING " knows: " + list);
  }
  HostTarget target;
  target.triple = llvm::Triple("x86_64-unknown-linux-gnu").normalize();
  target.cpu = cpu;
  llvm::SmallVector<llvm::StringRef, 64> features;
  llvm::X86::getFeaturesForCPU(cpu, features);
  // LLVM lists a CPU's own features, not what they imply: alderlake's list has avxvnni but
  // neither avx2 nor avx, which it implies.
  llvm::StringMap<bool> implied;
  for (llvm::StringRef feature : features) {
    implied[feature] = true;
    llvm::X86::updateImpliedFeatures(feature, true, implied);
  }
  for (const auto& entry : implied)
    if (entry.getValue())
      target.features.push_back(entry.getKey().str());
  std::sort(target.features.begin(), target.features.end());
  return target;
}

} // namespace rnnc::codegen
