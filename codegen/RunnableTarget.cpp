#include "codegen/Target.h"

#include "codegen/HostTarget.h"
#include "ir/Error.h"

namespace rnnc::codegen {

Target hostTarget() {
  return withHostCaches(targetFor(detectHostTarget()));
}

Target namedCpuTarget(const std::string& cpu) {
  return targetFor(namedX86Target(cpu));
}

Target runnableTarget(const std::string& cpu) {
  HostTarget here = detectHostTarget();
  if (cpu.empty())
    return withHostCaches(targetFor(here));
  HostTarget named = namedX86Target(cpu);
  for (const std::string& feature : named.features) {
    bool vector = feature.rfind("avx", 0) == 0 || feature.rfind("amx", 0) == 0 ||
                  feature == "fma" || feature == "f16c";
    if (vector && !here.has(feature))
      throw UserError("cannot run code for CPU '" + cpu + "' here: this CPU (" + here.cpu +
                      ") lacks " + feature);
  }
  return withHostCaches(targetFor(named));
}

} // namespace rnnc::codegen
