#include "codegen/HostTarget.h"

#include "codegen/LLVMHeaders.h"

#include <algorithm>

namespace rnnc::codegen {

bool HostTarget::has(const std::string& feature) const {
  return std::binary_search(features.begin(), features.end(), feature);
}

HostTarget detectHostTarget() {
  HostTarget target;
  target.triple = llvm::sys::getProcessTriple();
  target.cpu = llvm::sys::getHostCPUName().str();
  for (const auto& entry : llvm::sys::getHostCPUFeatures())
    if (entry.second)
      target.features.push_back(entry.first().str());
  std::sort(target.features.begin(), target.features.end());
  return target;
}

std::string llvmVersion() {
  return LLVM_VERSION_STRING;
}

} // namespace rnnc::codegen
