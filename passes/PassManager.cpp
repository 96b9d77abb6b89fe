#include "passes/PassManager.h"

#include "ir/Error.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/CommonSubexpressionElimination.h"
#include "passes/DeadCodeElimination.h"
#include "passes/Fuse.h"
#include "passes/FuseMatMul.h"
#include "passes/HoistParameters.h"
#include "passes/MergeGates.h"
#include "passes/Premultiply.h"
#include "passes/Simplify.h"
#include "passes/SinkSlices.h"
#include "passes/TrainingDropout.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

namespace rnnc::passes {

void checkPassName(const std::string& name, const std::string& option) {
  std::string list;
  for (const Pass& pass : allPasses()) {
    if (pass.name == name)
      return;
    list += (list.empty() ? "" : ", ") + pass.name;
  }
  throw UserError(option + ": no pass named '" + name + "'; the passes are: " + list);
}

std::vector<Pass> allPasses() {
  return {
      {"simplify", "constant folding and algebraic identities", simplify},
      {"cse", "common subexpression elimination", eliminateCommonSubexpressions},
      {"dce", "dead code elimination", eliminateDeadCode},
      {"hoist-parameters",
       "compute values made of parameters alone (a weight built from parameters) once, before "
       "the loop",
       hoistParameters},
      {"premultiply", "hoist state-independent matrix products and their biases out of the loop",
       premultiply, PassGroup::Premultiply},
      {"premultiply-cse",
       "common subexpression elimination of what premultiply hoisted, before the gates merge",
       eliminateCommonSubexpressions},
      {"merge-gates", "one matrix product per operand, by the stacked weights", mergeGates},
      {"sink-slices", "push slices through elementwise ops towards what they read", sinkSlices,
       PassGroup::Fusion},
      {"cleanup-cse", "common subexpression elimination after the rewrites",
       eliminateCommonSubexpressions},
      {"cleanup-dce", "dead code elimination after the rewrites", eliminateDeadCode},
      {"fuse", "group elementwise ops into fused kernels", fuseElementwise, PassGroup::Fusion},
      {"fuse-matmul", "compute the recurrent matrix product tile by tile inside its kernel",
       fuseMatMul, PassGroup::Fusion},
      {"training-dropout",
       "training only (--passes): each dropout as its input times an explicit mask, "
       "dropout_mask",
       lowerTrainingDropout, PassGroup::Training},
  };
}

std::vector<Pass> buildPipeline(const PipelineOptions& options) {
  for (const std::string& name : options.disabled)
    checkPassName(name, "--disable-pass");
  for (const std::string& name : options.printAfter)
    checkPassName(name, "--print-after");
  std::vector<Pass> pipeline;
  if (!options.only.empty()) {
    const std::vector<Pass> passes = allPasses();
    for (const std::string& name : options.only) {
      checkPassName(name, "--passes");
      pipeline.push_back(*std::find_if(passes.begin(), passes.end(),
                                       [&](const Pass& pass) { return pass.name == name; }));
    }
    return pipeline;
  }
  for (Pass& pass : allPasses()) {
    const bool groupOff = pass.group == PassGroup::Training ||
                          (pass.group == PassGroup::Premultiply && !options.premultiply) ||
                          (pass.group == PassGroup::Fusion && !options.fuse);
    if (groupOff || options.disabled.count(pass.name))
      continue;
    pipeline.push_back(std::move(pass));
  }
  return pipeline;
}

namespace {

// Whether each pass's output is verified, not only the pipeline's input and its result: always
// where assertions are on (the sanitizer and debug builds, where the tests run every pass), and
// wherever RNNC_VERIFY_EACH_PASS=1 asks. Verifying after all twelve passes was 40% of the
// pipeline's time (the default LSTM: 0.14 of 0.34 ms on an Intel VM, run again for every compile
// the disk cache serves, the larger part of its 0.5 ms); a pass that breaks the IR is still
// caught by the last verification, and the variable names the pass.
bool verifyEachPass() {
#ifndef NDEBUG
  return true;
#else
  static const bool asked = [] {
    const char* value = std::getenv("RNNC_VERIFY_EACH_PASS");
    return value && std::string(value) == "1";
  }();
  return asked;
#endif
}

} // namespace

void runPipeline(ir::Cell& cell, const PipelineOptions& options, std::ostream& log) {
  ir::verify(cell);
  // Fusion is decided last, on the final IR. A grouping the cell already has (a parsed dump, an
  // earlier run) is dropped first, so that no rewrite needs to keep kernels contiguous.
  for (ir::Block* block : {&cell.pre, &cell.step})
    for (auto& instr : *block)
      instr->kernel = -1;
  const bool eachPass = verifyEachPass();
  for (const Pass& pass : buildPipeline(options)) {
    const auto start = std::chrono::steady_clock::now();
    bool changed = pass.run(cell);
    // A pass that breaks the IR is a bug in rnnc, not in the user's cell.
    if (eachPass) {
      try {
        ir::verify(cell);
      } catch (const UserError& e) {
        throw InternalError("pass '" + pass.name + "' produced invalid IR: " + e.what());
      }
    }
    if (options.timings)
      options.timings->emplace_back(pass.name, std::chrono::duration<double, std::milli>(
                                                   std::chrono::steady_clock::now() - start)
                                                   .count());
    if (options.printAfterAll || options.printAfter.count(pass.name)) {
      log << "// ----- IR after " << pass.name << (changed ? "" : " (unchanged)") << " -----\n";
      if (changed)
        log << cell;
    }
  }
  if (!eachPass) { // whatever the passes said they changed
    try {
      ir::verify(cell);
    } catch (const UserError& e) {
      throw InternalError("the pass pipeline produced invalid IR (RNNC_VERIFY_EACH_PASS=1 names "
                          "the pass): " +
                          std::string(e.what()));
    }
  }
}

} // namespace rnnc::passes
