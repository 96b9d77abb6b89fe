// Every pass setting a cell must run under: the default pipeline, each pass disabled alone, no
// premultiply, no fusion. Shared by
// the cell regression tests and the differential fuzzer.
#pragma once

#include "passes/PassManager.h"

#include <set>
#include <string>
#include <vector>

namespace rnnc::test {

struct PassSetting {
  std::string name; // as the rnnc flags say it
  passes::PipelineOptions pipeline;
};

inline std::vector<PassSetting> everyPassSetting() {
  std::vector<PassSetting> settings = {{"default", {}}};
  for (const passes::Pass& pass : passes::allPasses()) {
    passes::PipelineOptions options;
    options.disabled.insert(pass.name);
    settings.push_back({"--disable-pass " + pass.name, options});
  }
  passes::PipelineOptions noPremul, noFuse;
  noPremul.premultiply = false;
  noFuse.fuse = false;
  settings.push_back({"--no-premul", noPremul});
  settings.push_back({"--no-fuse", noFuse});
  return settings;
}

} // namespace rnnc::test
