// The optimisation pipeline: a straight list of passes run in order, verifying the IR after each
// and logging it on request (`--print-after-all`, `--print-after=NAME`), as Halide's Lower.cpp
// does. Passes can be switched off by name.
#pragma once

#include "ir/Cell.h"

#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace rnnc::passes {

// A pass rewrites the cell in place and says whether it changed anything.
// What a pass belongs to, for the options that switch a whole group off (--no-premul,
// --no-fuse) rather than one pass by name.
// Training: run only when asked for by name (--passes); training applies it before the
// pipeline (passes/TrainingDropout.h).
enum class PassGroup { Always, Premultiply, Fusion, Training };

struct Pass {
  std::string name; // unique in the pipeline: --disable-pass and --print-after choose by it
  std::string description;
  std::function<bool(ir::Cell&)> run;
  PassGroup group = PassGroup::Always;
};

struct PipelineOptions {
  bool premultiply = true; // hoist the input projection out of the time loop
  bool fuse = true;        // group elementwise work into fused kernels
  std::set<std::string> disabled;
  // When not empty, exactly these passes in this order, whatever the switches above say
  // (`--passes`: how tests/passes/*.ir run one pass alone).
  std::vector<std::string> only;
  bool printAfterAll = false;
  std::set<std::string> printAfter;
  // When set, each pass's name and milliseconds (its verification included) are appended here
  // (`rnnc compile --time-passes`).
  std::vector<std::pair<std::string, double>>* timings = nullptr;
};

// Every pass rnnc knows, in pipeline order.
std::vector<Pass> allPasses();

// Throws UserError naming `option` and every pass when no pass is named `name`.
void checkPassName(const std::string& name, const std::string& option);

// The passes the options select, in order.
std::vector<Pass> buildPipeline(const PipelineOptions& options);

// Runs the pipeline on `cell`, verifying after every pass. IR requested by the options is
// written to `log`. Throws UserError for an unknown pass name in the options.
void runPipeline(ir::Cell& cell, const PipelineOptions& options, std::ostream& log);

} // namespace rnnc::passes
