#include "codegen/Compiler.h"

#include "codegen/CellEmitter.h"
#include "codegen/CompilerLibrary.h"
#include "codegen/GemmTile.h"
#include "codegen/GpuEmitter.h"
#include "codegen/LLVMError.h"
#include "codegen/LLVMHeaders.h"
#include "codegen/LLVMHostTarget.h"
#include "codegen/ObjectBundle.h"
#include "codegen/OptimisationPipeline.h"
#include "codegen/RunArgs.h"
#include "codegen/SourceDigest.h"
#include "ir/Error.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace rnnc::codegen {
namespace {

void initialiseLLVM() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    // Loop strength reduction costs a fifth of the back end's time on our kernels and buys
    // nothing measurable: their loops address memory as base + index, which x86 addressing
    // modes do for free. It is switchable only through LLVM's command-line options (in this
    // process only, and only once).
    // The machine instruction scheduler is a tenth of a cold compile's work (Zen 4, the default
    // LSTM's parts on one core: 36-41 -> 32-37 ms) and reorders nothing that matters here: the
    // emitter already orders each tile's loads, broadcasts and FMAs, and the kernels' hot loops
    // came out the same but for where a broadcast sits (instruction and stack-reference counts of
    // the FMA loops equal within 3% for fp32, fp16, bf16, int8, AVX2 and the backward cell), at
    // the same speed (alternating runs, 1 thread: LSTM T=100 B=64 247.4 vs 247.6 ms, B=1 6.46
    // vs 6.46, int8 78.4 vs 78.0, GRU 185.5 vs 185.4 on average of four).
    // Three more machine passes cost work and change nothing the kernels run: machine CSE,
    // machine copy propagation and the AVX-512 domain reassignment (GPR logic moved to mask
    // registers, of which our kernels have none worth moving). Without them LLVM's back end did
    // 5-8% fewer instructions per module (callgrind on llc-19 with these options, both parts:
    // default LSTM 135.4M -> 126.3M, GRU 133.5M -> 125.5M, lnlstm 179.4M -> 170.4M, lstm_proj
    // 177.3M -> 166.9M; cold compiles 0.93x and 0.95x, medians of paired runs, Intel Xeon). The
    // instructions of the loops four and five deep (depth loops, tile epilogues) were as many
    // within 1%, those of the loops three deep within 3%, for fp32, fp16, bf16 and int8, the
    // backward cell, AVX-512 and AVX2. Machine LICM would spare 7% more, but leaves constant
    // broadcasts in the loops it hoists them from: three more in int8's AVX2 depth loop.
    const char* args[] = {"rnnc",
                          "-disable-lsr",
                          "-enable-misched=false",
                          "-disable-machine-cse",
                          "-disable-copyprop",
                          "-disable-x86-domain-reassignment"};
    llvm::cl::ParseCommandLineOptions(static_cast<int>(std::size(args)), args);
  });
}

void initialiseNVPTX() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
}

std::unique_ptr<llvm::TargetMachine> makeTargetMachine(const Target& target) {
  if (target.isGpu()) {
    initialiseNVPTX();
    std::string error;
    const llvm::Target* nvptx = llvm::TargetRegistry::lookupTarget(target.triple, error);
    if (!nvptx)
      throw InternalError("no NVPTX back end in this LLVM: " + error);
    return std::unique_ptr<llvm::TargetMachine>(nvptx->createTargetMachine(
        target.triple, target.cpu, target.features, llvm::TargetOptions(), std::nullopt,
        std::nullopt, llvm::CodeGenOptLevel::Default));
  }
  llvm::orc::JITTargetMachineBuilder builder{llvm::Triple(target.triple)};
  builder.setCPU(target.cpu);
  llvm::SubtargetFeatures features(target.features);
  builder.addFeatures(features.getFeatures());
  // -O1 code generation: the emitted IR is already tiled, vectorised and scheduled by hand, so
  // the backend's extra effort at -O2 bought nothing measurable at run time (interleaved A/B of
  // LSTM, GRU, batch 1 and rnn_eltwise) and cost 2-3 ms of the 30 ms cold-compile budget.
  builder.setCodeGenOptLevel(llvm::CodeGenOptLevel::Less);
  builder.setRelocationModel(llvm::Reloc::PIC_);
  // The small code model: constants are read RIP-relative (one load) instead of through the
  // GOT's address plus a 64-bit offset (a movabs and a register each), which the kernels'
  // epilogues (sigmoid, tanh: a dozen constants) paid in instructions and registers. LLVM's JIT
  // default is the large model, for a JIT linker that may place sections anywhere; our loader
  // (runtime/exec/ObjectLoader.h) maps an object's sections together and reaches far functions
  // through stubs. Zen 5, 1 thread, three alternating runs each without the cache: the default
  // LSTM 143.1/145.9/152.8 -> 136.3/136.7/145.9 ms, the GRU 115.5/107.1/107.1 -> 106.6/100.6/104.5.
  builder.setCodeModel(llvm::CodeModel::Small);
  return unwrap(builder.createTargetMachine(), "creating the target machine");
}

// Target machines kept for the next module of the same target: building one (its subtarget,
// the CPU's scheduling model and feature tables) cost a millisecond of each cold compile's work
// per module, three modules a cell. A machine compiles one module at a time, so each is lent to
// one thread and comes back when that module is done; a target keeps as many as were ever in
// use at once (a cell's parts run on at most a thread per core).
class TargetMachinePool {
public:
  struct Return {
    std::string key;
    void operator()(llvm::TargetMachine* machine) const { pool().put(key, machine); }
  };
  using Lease = std::unique_ptr<llvm::TargetMachine, Return>;

  static Lease lease(const Target& target) {
    std::string key = target.triple + "|" + target.cpu + "|" + target.features;
    if (llvm::TargetMachine* kept = pool().take(key))
      return Lease(kept, Return{std::move(key)});
    return Lease(makeTargetMachine(target).release(), Return{std::move(key)});
  }

private:
  static TargetMachinePool& pool() {
    static TargetMachinePool* instance = new TargetMachinePool; // alive while compiles may end
    return *instance;
  }
  llvm::TargetMachine* take(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = idle.find(key);
    if (found == idle.end() || found->second.empty())
      return nullptr;
    llvm::TargetMachine* machine = found->second.back().release();
    found->second.pop_back();
    return machine;
  }
  void put(const std::string& key, llvm::TargetMachine* machine) {
    std::lock_guard<std::mutex> lock(mutex);
    idle[key].emplace_back(machine);
  }

  std::mutex mutex;
  std::map<std::string, std::vector<std::unique_ptr<llvm::TargetMachine>>> idle;
};

std::string emitMachineCode(llvm::Module& module, llvm::TargetMachine& machine,
                            llvm::CodeGenFileType type) {
  llvm::SmallString<0> bytes;
  llvm::raw_svector_ostream out(bytes);
  llvm::legacy::PassManager passes;
  if (machine.addPassesToEmitFile(passes, out, nullptr, type))
    throw InternalError("the target cannot emit this file type");
  passes.run(module);
  return std::string(bytes.str());
}

std::string printModule(const llvm::Module& module) {
  std::string text;
  llvm::raw_string_ostream out(text);
  module.print(out, nullptr);
  return text;
}

using Clock = std::chrono::steady_clock;

double millisecondsSince(Clock::time_point& start) {
  const Clock::time_point now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - start).count();
  start = now;
  return ms;
}

// Verifies `module`, then produces `stage` of it for `target`, timing each part into `times`.
std::string finish(std::unique_ptr<llvm::Module> module, const Target& target, Stage stage,
                   CodegenTimes& times) {
  Clock::time_point start = Clock::now();
  std::string problems;
  llvm::raw_string_ostream problemStream(problems);
  if (llvm::verifyModule(*module, &problemStream))
    throw InternalError("generated LLVM IR is invalid: " + problems + "\n" + printModule(*module));
  times.verify = millisecondsSince(start);
  if (stage == Stage::LLVM)
    return printModule(*module);
  TargetMachinePool::Lease machine = TargetMachinePool::lease(target);
  module->setDataLayout(machine->createDataLayout());
  times.targetMachine = millisecondsSince(start);
  optimiseModule(*module, *machine, target.isGpu());
  times.optimise = millisecondsSince(start);
  std::string result;
  switch (stage) {
  case Stage::OptimisedLLVM:
    result = printModule(*module);
    break;
  case Stage::Assembly:
    result = emitMachineCode(*module, *machine, llvm::CodeGenFileType::AssemblyFile);
    break;
  default:
    result = emitMachineCode(*module, *machine, llvm::CodeGenFileType::ObjectFile);
  }
  times.backEnd = millisecondsSince(start);
  return result;
}

std::string finish(std::unique_ptr<llvm::Module> module, const Target& target, Stage stage) {
  CodegenTimes ignored;
  return finish(std::move(module), target, stage, ignored);
}

// The library's implementations of codegen/Compiler.h (CompilerLibrary.h's table).

// One part of a cell's code (CellEmitter.h), in a context of its own.
std::string generateCellPart(const ir::Cell& cell, const StoragePlan& plan, const Target& target,
                             Stage stage, CellPart part, CodegenTimes& times) {
  Clock::time_point start = Clock::now();
  llvm::LLVMContext context;
  std::unique_ptr<llvm::Module> module =
      emitCell(context, cell, plan, target, kRunFunctionName, part);
  times.emit = millisecondsSince(start);
  return finish(std::move(module), target, stage, times);
}

// What a part's module holds, by its first function (`rnnc compile --time-passes`).
std::string partName(CellPart part) {
  switch (part) {
  case CellPart::Setup:
    return setupFunctionName(kRunFunctionName) + " (setup and tile walks)";
  case CellPart::Loop:
    return std::string(kRunFunctionName) + " (time loop)";
  }
  return kRunFunctionName;
}

// The cell's two parts compiled side by side, on as many threads as the machine has cores (up
// to two): LLVM's back end, most of a cold compile, runs on one thread per module. The setup
// part holds the weights' packing, the input projection over the sequence and the walks over
// the depth of every product's full tiles (the recurrent product's too: one function for a
// walk of the same shape); the loop part the time loop, which calls them. On two cores they
// take about as long (the default LSTM's, in instructions retired under callgrind: 84M and 80M,
// where the walks in the loop and its single-row tile in a third module made the loop part
// alone 109M). An object is the bundle of both, the setup part first (the loop calls into it);
// text stages are the modules one after the other, in the same order.
std::string generateCell(const ir::Cell& cell, const StoragePlan& plan, const Target& target,
                         Stage stage, CodegenTimes* times) {
  initialiseLLVM();
  struct Part {
    CellPart part;
    std::string result;
    CodegenTimes times;
    std::exception_ptr error;
  };
  std::vector<Part> parts{{CellPart::Setup, {}, {}, {}}, {CellPart::Loop, {}, {}, {}}};
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < parts.size(); i = next++) {
      Part& p = parts[i];
      try {
        p.result = generateCellPart(cell, plan, target, stage, p.part, p.times);
      } catch (...) {
        p.error = std::current_exception();
      }
    }
  };
  const Clock::time_point start = Clock::now();
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < std::min(cores, parts.size()); ++i)
    helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers)
    helper.join();
  const double wall = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  for (const Part& p : parts)
    if (p.error)
      std::rethrow_exception(p.error);
  if (times) { // the work of all parts (on several threads, more than the time it took)
    *times = {};
    times->wall = wall;
    for (const Part& p : parts) {
      times->emit += p.times.emit;
      times->verify += p.times.verify;
      times->targetMachine += p.times.targetMachine;
      times->optimise += p.times.optimise;
      times->backEnd += p.times.backEnd;
      times->modules.push_back({partName(p.part), p.times.emit + p.times.verify +
                                                      p.times.targetMachine + p.times.optimise +
                                                      p.times.backEnd});
    }
  }
  if (stage == Stage::Object)
    return bundleObjects({std::move(parts[0].result), std::move(parts[1].result)});
  const std::string comment = stage == Stage::Assembly ? "#" : ";";
  return parts[0].result + "\n" + comment + " ---- the time loop (" + kRunFunctionName +
         "), a module of its own ----\n" + parts[1].result;
}

std::string generateGpuCell(const ir::Cell& cell, const StoragePlan& plan, const Target& gpu,
                            Stage stage) {
  RNNC_INTERNAL_CHECK(gpu.isGpu(), "generateGpu for a CPU target");
  if (stage == Stage::Object)
    throw InternalError("a GPU's code is PTX (Stage::Assembly), loaded by the CUDA driver");
  initialiseLLVM();
  llvm::LLVMContext context;
  return finish(emitGpuCell(context, cell, plan, planGpuRegions(cell, plan), gpu), gpu, stage);
}

std::string generateGpuEmulationCell(const ir::Cell& cell, const StoragePlan& plan, Stage stage) {
  initialiseLLVM();
  // The host's instruction set, with the GPU's scalar lanes: the same code as the kernels'.
  static const HostTarget cpu = llvmHostTarget();
  Target host = withHostCaches(targetFor(cpu));
  host.vectorWidth = 1;
  host.interleavedVectors = 1;
  llvm::LLVMContext context;
  return finish(emitGpuCell(context, cell, plan, planGpuRegions(cell, plan), host), host, stage);
}

std::string generateGemmTileObject(const Target& target, Stage stage, GemmOperands operands) {
  RNNC_INTERNAL_CHECK(!target.isGpu(), "the runtime GEMM runs on the CPU");
  RNNC_INTERNAL_CHECK(operands == GemmOperands::F32 || target.pairsBf16Products(),
                      "bf16 pairs on a target that does not pair bf16 products");
  initialiseLLVM();
  llvm::LLVMContext context;
  return finish(emitGemmTile(context, target, operands), target, stage);
}

// Runs `call`, catching what it throws into *failure (CompilerLibrary.h): nothing thrown leaves
// the library.
template <typename Call> auto caught(CompilerFailure* failure, Call&& call) -> decltype(call()) {
  using Kind = CompilerFailure::Kind;
  try {
    return call();
  } catch (const UserError& e) {
    *failure = {Kind::User, e.what()};
  } catch (const InternalError& e) {
    *failure = {Kind::Internal, e.what()};
  } catch (const std::bad_alloc& e) {
    *failure = {Kind::OutOfMemory, e.what()};
  } catch (const std::exception& e) {
    *failure = {Kind::Other, e.what()};
  } catch (...) {
    *failure = {Kind::Other, "an exception that is no std::exception"};
  }
  return {};
}

} // namespace

} // namespace rnnc::codegen

extern "C" __attribute__((visibility("default"))) const rnnc::codegen::CompilerApi*
rnnc_compiler_api() {
  using namespace rnnc;
  using namespace rnnc::codegen;
  static const CompilerApi api{
      kCompilerAbi,
      sourceDigest(),
      [](const ir::Cell& cell, const StoragePlan& plan, const Target& target, Stage stage,
         CodegenTimes* times, CompilerFailure* failure) {
        return caught(failure, [&] { return generateCell(cell, plan, target, stage, times); });
      },
      [](const ir::Cell& cell, const StoragePlan& plan, const Target& gpu, Stage stage,
         CompilerFailure* failure) {
        return caught(failure, [&] { return generateGpuCell(cell, plan, gpu, stage); });
      },
      [](const ir::Cell& cell, const StoragePlan& plan, Stage stage, CompilerFailure* failure) {
        return caught(failure, [&] { return generateGpuEmulationCell(cell, plan, stage); });
      },
      [](const Target& target, Stage stage, GemmOperands operands, CompilerFailure* failure) {
        return caught(failure, [&] { return generateGemmTileObject(target, stage, operands); });
      },
      [](CompilerFailure* failure) { return caught(failure, [] { return llvmHostTarget(); }); },
      [](const std::string& cpu, CompilerFailure* failure) {
        return caught(failure, [&] { return llvmNamedX86Target(cpu); });
      }};
  return &api;
}
