#include "codegen/OptimisationPipeline.h"
#include "codegen/LLVMHeaders.h"

namespace rnnc::codegen {

namespace {

// The pipelines are built pass by pass rather than parsed from text: PassBuilder's parser names
// every pass LLVM has (its registry), so linking it linked them all, their code and their static
// constructors (command-line options), into the compiler library. Built here, the library is 34
// rather than 48 MB with 263 static constructors instead of 385, and loading it took 14.5 rather
// than 16.9 ms (Zen 5 VM); the code it generates is the same, byte for byte (every built-in cell
// and 40 of the fuzzer's, as LLVM IR, AVX-512, AVX2, int8, backward steps and PTX).
// tests/test_codegen_targets.cpp checks what each pipeline does to our code.

// The emitter writes vector code and unrolls what needs unrolling itself, so the generic -O1
// pipeline (inlining, loop rotation and unrolling, vectorisers) mostly costs compile time. What
// the generated code does need: stack slots promoted to registers, redundant loads and address
// arithmetic merged, and loop-invariant work hoisted out of the kernels' loops. No instcombine:
// it was half of this pipeline's time (a tenth of a cold compile's work, in a perf profile of
// repeated compiles) and bought nothing: without it the default-size LSTM's kernels are 1529
// instructions instead of 1588, the GRU's 1411 instead of 1435, bf16 LSTM 2004 instead of 2274,
// and the run times were the same (Zen 4, alternating: fp32 LSTM/GRU at T=100 B=64 and B=1,
// bf16 and int8 LSTM).
//
// A GPU module (`withInstCombine`) needs instcombine as well: its regions are inlined into its
// kernels (and then dropped), once the address spaces the emitter states (GpuEmitter's
// markGlobal) are carried to their loads and stores, and inlining leaves the casts that say so
// for instcombine to simplify away.
void addFunctionPasses(llvm::FunctionPassManager& passes, bool withInstCombine) {
  passes.addPass(llvm::SROAPass(llvm::SROAOptions::ModifyCFG));
  passes.addPass(llvm::EarlyCSEPass(/*UseMemorySSA=*/false));
  passes.addPass(llvm::SimplifyCFGPass(llvm::SimplifyCFGOptions()));
  if (withInstCombine)
    passes.addPass(llvm::InstCombinePass(llvm::InstCombineOptions().setVerifyFixpoint(false)));
  llvm::LoopPassManager loopPasses;
  loopPasses.addPass(llvm::LICMPass(llvm::LICMOptions()));
  passes.addPass(llvm::createFunctionToLoopPassAdaptor(std::move(loopPasses),
                                                       /*UseMemorySSA=*/true));
  passes.addPass(llvm::SimplifyCFGPass(llvm::SimplifyCFGOptions()));
}

// The analyses the passes above ask for, and those these ask for in turn (PassBuilder's
// registerFunctionAnalyses would register every analysis LLVM has: linking PassBuilder links all
// of LLVM's passes). An analysis asked for but not registered is a crash in a release build of
// LLVM: these are what LLVM 19's passes here and their analyses query, with the ones they query
// only in some cases (block frequencies, branch probabilities, remarks), and the tests run both
// pipelines over every built-in cell and the fuzzer's random ones. The alias analyses are
// PassBuilder's default ones less the target's: NVPTX's (address spaces do not alias) registers
// through PassBuilder alone; without it the PTX is the same for every built-in cell, and a
// missing alias fact can only keep a load in a loop, never change a result.
void registerAnalyses(llvm::ModuleAnalysisManager& modules,
                      llvm::FunctionAnalysisManager& functions, llvm::LoopAnalysisManager& loops,
                      llvm::TargetMachine& machine) {
  modules.registerPass([] { return llvm::PassInstrumentationAnalysis(); });
  modules.registerPass([&] { return llvm::FunctionAnalysisManagerModuleProxy(functions); });
  modules.registerPass([] { return llvm::ProfileSummaryAnalysis(); });

  functions.registerPass([] { return llvm::PassInstrumentationAnalysis(); });
  functions.registerPass([&] { return llvm::ModuleAnalysisManagerFunctionProxy(modules); });
  functions.registerPass([&] { return llvm::LoopAnalysisManagerFunctionProxy(loops); });
  functions.registerPass([] {
    llvm::AAManager aliasAnalyses;
    aliasAnalyses.registerFunctionAnalysis<llvm::BasicAA>();
    aliasAnalyses.registerFunctionAnalysis<llvm::ScopedNoAliasAA>();
    aliasAnalyses.registerFunctionAnalysis<llvm::TypeBasedAA>();
    return aliasAnalyses;
  });
  functions.registerPass([] { return llvm::BasicAA(); });
  functions.registerPass([] { return llvm::ScopedNoAliasAA(); });
  functions.registerPass([] { return llvm::TypeBasedAA(); });
  functions.registerPass([] { return llvm::AssumptionAnalysis(); });
  functions.registerPass([] { return llvm::DominatorTreeAnalysis(); });
  functions.registerPass([] { return llvm::PostDominatorTreeAnalysis(); });
  functions.registerPass([] { return llvm::LoopAnalysis(); });
  functions.registerPass([] { return llvm::ScalarEvolutionAnalysis(); });
  functions.registerPass([] { return llvm::MemorySSAAnalysis(); });
  functions.registerPass([] { return llvm::TargetLibraryAnalysis(); });
  functions.registerPass([&] { return machine.getTargetIRAnalysis(); });
  functions.registerPass([] { return llvm::OptimizationRemarkEmitterAnalysis(); });
  functions.registerPass([] { return llvm::BlockFrequencyAnalysis(); });
  functions.registerPass([] { return llvm::BranchProbabilityAnalysis(); });

  loops.registerPass([] { return llvm::PassInstrumentationAnalysis(); });
  loops.registerPass([&] { return llvm::FunctionAnalysisManagerLoopProxy(functions); });
}

} // namespace

void optimiseModule(llvm::Module& module, llvm::TargetMachine& machine, bool gpu) {
  llvm::LoopAnalysisManager loops;
  llvm::FunctionAnalysisManager functions;
  llvm::ModuleAnalysisManager modules;
  registerAnalyses(modules, functions, loops, machine);
  llvm::ModulePassManager pipeline;
  if (gpu) {
    pipeline.addPass(llvm::createModuleToFunctionPassAdaptor(llvm::InferAddressSpacesPass()));
    pipeline.addPass(llvm::AlwaysInlinerPass());
    pipeline.addPass(llvm::GlobalDCEPass());
  }
  llvm::FunctionPassManager functionPasses;
  addFunctionPasses(functionPasses, /*withInstCombine=*/gpu);
  pipeline.addPass(llvm::createModuleToFunctionPassAdaptor(std::move(functionPasses)));
  pipeline.run(module, modules);
}

} // namespace rnnc::codegen
