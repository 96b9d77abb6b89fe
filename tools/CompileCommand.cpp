// `rnnc compile`: runs the optimisation pipeline on a cell and shows any stage of it; `rnnc dump`
// is its first stage (`compile --emit=ir`), on the same code path.
#include "codegen/Compiler.h"
#include "frontend/BuiltinCells.h"
#include "ir/Error.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Autodiff.h"
#include "passes/PassManager.h"
#include "passes/TrainingDropout.h"
#include "runtime/exec/CellBuild.h"
#include "runtime/exec/TargetMemo.h"
#include "tools/CommandLine.h"
#include "tools/Commands.h"

#include <fmt/format.h>
#include <iostream>
#include <memory>
#include <optional>

namespace rnnc::tools {
namespace {

struct CompileCommandOptions {
  std::string cell;
  std::vector<std::string> sizes;
  std::string emit = "ir-opt";
  std::string targetCpu; // empty: this machine
  std::string target = "cpu";
  std::string gpu = "sm_80";
  bool noTensorCores = false; // with --target nvptx: every product in fp32 FMAs
  bool grad = false;          // the backward cell instead (passes/Autodiff.h)
  bool train = false;         // as training runs it: dropout's masks explicit
  bool timePasses = false;
  std::string weightsDtype = "fp32";
  PipelineFlags pipeline;
};

int compile(const CompileCommandOptions& o) {
  // A named CPU is checked first, so that a misspelt one is reported before any other work; the
  // host's target is looked up only for the stages that need it (runtime/exec/TargetMemo.h), so
  // that the IR stages never load the compiler library.
  std::optional<codegen::Target> named;
  if (!o.targetCpu.empty())
    named = codegen::namedCpuTarget(o.targetCpu);
  if (!o.targetCpu.empty() && (o.emit == "ir" || o.emit == "ir-opt"))
    throw UserError("--target-cpu applies to --emit=llvm, llvm-opt and asm; the IR does not "
                    "depend on the CPU");
  const bool nvptx = o.target == "nvptx";
  if (nvptx && !o.targetCpu.empty())
    throw UserError("--target-cpu names an x86-64 CPU; with --target nvptx the GPU is --gpu");
  if (o.emit == "ptx" && !nvptx)
    throw UserError("--emit=ptx is the GPU's code: add --target nvptx (and --gpu sm_80|sm_90)");
  if (nvptx && o.emit == "asm")
    throw UserError("--target nvptx emits PTX: use --emit=ptx");
  const codegen::Target gpu =
      nvptx ? codegen::gpuTarget(o.gpu, !o.noTensorCores) : codegen::Target{};
  const codegen::WeightType weights = codegen::parseWeightType(o.weightsDtype);
  auto cell = frontend::loadCell(o.cell);
  ir::SizeMap sizes = parseSizes(o.sizes);
  if (!sizes.empty()) {
    cell->bindSizes(sizes);
    ir::verify(*cell);
  }
  if (o.train) {
    passes::lowerTrainingDropout(*cell);
    // A dropout of parameters alone: times a mask parameter, which a training run fills.
    passes::lowerParameterDropout(*cell);
  }
  if (o.grad)
    cell = passes::deriveBackward(*cell).cell;
  if (o.emit == "ir") {
    std::cout << *cell;
    return 0;
  }
  // The per-pass log goes to stderr so that stdout stays the requested stage, as with opt.
  std::vector<std::pair<std::string, double>> passTimes;
  passes::PipelineOptions pipeline = o.pipeline.options();
  if (o.timePasses)
    pipeline.timings = &passTimes;
  std::shared_ptr<ir::Cell> optimised = optimiseCell(*cell, pipeline, &std::cerr);
  // --time-passes: what each part of the compile took, ours and LLVM's, on stderr.
  double ours = 0;
  for (const auto& [name, ms] : passTimes)
    ours += ms;
  auto printTimes = [&](const codegen::CodegenTimes* llvmTimes, double planMs) {
    if (!o.timePasses)
      return;
    std::cerr << fmt::format("// ----- time of each part (ms) -----\n");
    for (const auto& [name, ms] : passTimes)
      std::cerr << fmt::format("{:>9.3f}  pass {}\n", ms, name);
    std::cerr << fmt::format("{:>9.3f}  rnnc passes in all\n", ours);
    if (!llvmTimes)
      return;
    const codegen::CodegenTimes& t = *llvmTimes;
    std::cerr << fmt::format("{:>9.3f}  storage plan\n", planMs)
              << fmt::format("{:>9.3f}  emit LLVM IR\n", t.emit)
              << fmt::format("{:>9.3f}  LLVM verifier\n", t.verify)
              << fmt::format("{:>9.3f}  LLVM target machine\n", t.targetMachine)
              << fmt::format("{:>9.3f}  LLVM optimiser\n", t.optimise)
              << fmt::format("{:>9.3f}  LLVM back end\n", t.backEnd)
              << fmt::format("{:>9.3f}  in all\n", ours + planMs + t.emit + t.verify +
                                                       t.targetMachine + t.optimise + t.backEnd);
    if (t.modules.size() > 1) {
      std::cerr << "// each module's LLVM work, compiled side by side (a thread per core):\n";
      for (const codegen::CodegenTimes::Module& m : t.modules)
        std::cerr << fmt::format("{:>9.3f}  module {}\n", m.ms, m.name);
      // The work above is summed over threads; what a compile waits for is the wall time. A
      // process's first compile also pays for LLVM's first use (its code paged in, its options
      // parsed): `rnnc bench` reports the cold compile of a process that has compiled before.
      std::cerr << fmt::format("{:>9.3f}  wall: the modules side by side, the first compile of "
                               "this process\n",
                               t.wall);
    }
  };
  if (o.emit == "ir-opt") {
    printTimes(nullptr, 0);
    std::cout << *optimised;
    return 0;
  }
  for (const auto& name : optimised->sizeNames)
    if (!optimised->sizes.count(name))
      throw UserError("--emit=" + o.emit + " generates code for concrete sizes; give size '" +
                      name + "' with --size " + name + "=VALUE");
  codegen::Stage stage = o.emit == "llvm"       ? codegen::Stage::LLVM
                         : o.emit == "llvm-opt" ? codegen::Stage::OptimisedLLVM
                                                : codegen::Stage::Assembly;
  const CellBuild build = planCell(optimised,
                                   nvptx   ? gpu
                                   : named ? *named
                                           : runnableTarget("", CacheOptions::fromEnvironment()),
                                   weights);
  if (nvptx) {
    std::cout << build.generate(o.emit == "ptx" ? codegen::Stage::Assembly : stage);
    return 0;
  }
  codegen::CodegenTimes times;
  const std::string text = build.generate(stage, &times);
  printTimes(&times, build.planMs);
  std::cout << text;
  return 0;
}

} // namespace

CommandAction addDumpCommand(CLI::App& app) {
  auto o = std::make_shared<CompileCommandOptions>();
  o->emit = "ir";
  CLI::App* cmd = app.add_subcommand("dump", "Print a cell's IR (rnnc compile --emit=ir)");
  cmd->add_option("cell", o->cell, "Built-in cell name, .cell file or .rnnir IR dump")->required();
  cmd->add_option("--size", o->sizes, "Bind a named size: NAME=VALUE (repeatable)");
  return [o] { return compile(*o); };
}

CommandAction addCompileCommand(CLI::App& app) {
  auto o = std::make_shared<CompileCommandOptions>();
  CLI::App* cmd = app.add_subcommand("compile", "Optimise a cell and print a stage of it");
  cmd->add_option("cell", o->cell, "Built-in cell name, .cell file or .rnnir IR dump")->required();
  cmd->add_option("--size", o->sizes, "Bind a named size: NAME=VALUE (repeatable)");
  cmd->add_option("--emit", o->emit,
                  "Stage to print: ir (as parsed), ir-opt (optimised), llvm, llvm-opt (after "
                  "LLVM's optimiser), asm (host assembly), ptx (with --target nvptx)")
      ->check(CLI::IsMember({"ir", "ir-opt", "llvm", "llvm-opt", "asm", "ptx"}))
      ->default_val("ir-opt");
  cmd->add_option("--target-cpu", o->targetCpu,
                  "Generate code for this x86-64 CPU, by LLVM's name (skylake-avx512, znver4, "
                  "x86-64-v3, ...), not for this machine: e.g. to read the AVX-512 kernels on a "
                  "machine without AVX-512");
  cmd->add_option("--target", o->target,
                  "cpu (this machine, or --target-cpu) or nvptx (NVIDIA GPUs: the cell's grid "
                  "kernels as NVVM IR with --emit=llvm, PTX with --emit=ptx)")
      ->check(CLI::IsMember({"cpu", "nvptx"}))
      ->default_val("cpu");
  cmd->add_option("--gpu", o->gpu,
                  "With --target nvptx: the GPU's compute capability, sm_80 or "
                  "sm_90")
      ->default_val("sm_80");
  cmd->add_flag("--no-tensor-cores", o->noTensorCores,
                "With --target nvptx: the block tiles' matrix products in fp32 FMAs rather than "
                "on the tensor cores (mma.sync on TF32, three per product: fp32's accuracy)");
  cmd->add_option("--weights-dtype", o->weightsDtype,
                  "Store the weights of the matrix products as fp32, bf16, fp16 or int8 (the "
                  "code that widens, pairs or quantizes them shows in --emit=llvm and asm)")
      ->default_val("fp32");
  cmd->add_flag("--time-passes", o->timePasses,
                "Print what each part of the compile took to stderr: every rnnc pass, the "
                "storage plan, and LLVM's IR emission, verifier, target setup, optimiser and back "
                "end (with --emit=asm all of them)");
  cmd->add_flag("--grad", o->grad,
                "The cell's backward step (one step of backpropagation through time, derived "
                "by reverse-mode autodiff) instead of the cell");
  cmd->add_flag("--train", o->train,
                "The cell as training runs it: each dropout its input times an explicit mask "
                "(dropout_mask, drawn per row and column from the seed), a dropout of "
                "parameters alone times a mask parameter (dropout_mask.<k>, one for the run); "
                "with --grad, the training backward step, which reads the masks the forward "
                "kept");
  o->pipeline.addTo(*cmd);
  return [o] { return compile(*o); };
}

void PipelineFlags::addTo(CLI::App& cmd) {
  cmd.add_flag("--print-after-all", printAfterAll, "Print the IR after every pass (to stderr)");
  cmd.add_option("--print-after", printAfter, "Print the IR after the named pass (repeatable)");
  cmd.add_option("--disable-pass", disabled, "Skip the named pass (repeatable)");
  cmd.add_option("--passes", only,
                 "Run exactly these passes, in this order, instead of the pipeline "
                 "(comma-separated: e.g. --passes=cse,dce to see what they do alone)")
      ->delimiter(',');
  cmd.add_flag("--no-premul", noPremul, "Keep the input projection inside the time loop");
  cmd.add_flag("--no-fuse", noFuse, "Do not fuse elementwise ops");
}

passes::PipelineOptions PipelineFlags::options() const {
  passes::PipelineOptions options;
  options.premultiply = !noPremul;
  options.fuse = !noFuse;
  options.printAfterAll = printAfterAll;
  options.printAfter = {printAfter.begin(), printAfter.end()};
  options.disabled = {disabled.begin(), disabled.end()};
  options.only = only;
  return options;
}

} // namespace rnnc::tools
