#include "ir/KernelGroups.h"

namespace rnnc::ir {

std::vector<KernelGroup> kernelGroups(const Block& block) {
  std::vector<KernelGroup> groups;
  for (size_t i = 0; i < block.size();) {
    const Instr& instr = *block[i];
    size_t end = i + 1;
    if (instr.kernel >= 0)
      while (end < block.size() && block[end]->kernel == instr.kernel)
        ++end;
    bool emitsLoop = instr.kernel >= 0 || (isElementwise(instr.op) && instr.op != Op::Const);
    if (emitsLoop)
      groups.push_back({i, end});
    i = end;
  }
  return groups;
}

} // namespace rnnc::ir
