#include "runtime/CompiledCell.h"

#include "codegen/Compiler.h"
#include "codegen/HostTarget.h"
#include "codegen/Jit.h"
#include "codegen/RunArgs.h"
#include "codegen/SourceDigest.h"
#include "ir/Error.h"
#include "ir/Printer.h"
#include "runtime/Kernels.h"

#include <chrono>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

namespace rnnc {
namespace {

// One JIT per process, like a code cache: every compiled cell is loaded into it.
codegen::Jit& processJit() {
  static codegen::Jit jit({{codegen::kGemmSymbol, reinterpret_cast<void*>(&rnnc_gemm)},
                           {codegen::kLayerNormSymbol, reinterpret_cast<void*>(&rnnc_layernorm)}});
  return jit;
}

// Everything the object file depends on: the optimised IR (sizes included), the code
// generator's sources, LLVM and the target. No LLVM runs to build it, so a cache hit costs only
// the passes, a file read and the JIT's link.
std::string cacheKey(const ir::Cell& optimised, const codegen::Target& target) {
  return "rnnc " RNNC_VERSION " codegen " + std::string(codegen::sourceDigest()) + "\nLLVM " +
         codegen::llvmVersion() + "\ntarget " + target.describe() + "\n" + ir::toString(optimised);
}

// Code compiled in this process, by cache key.
struct MemoryCache {
  std::mutex mutex;
  std::unordered_map<std::string, std::weak_ptr<CompiledCell>> cells;
};

MemoryCache& memoryCache() {
  static MemoryCache cache;
  return cache;
}

int64_t rowsFor(const codegen::BufferSpec& spec, int64_t steps, int64_t batch) {
  switch (spec.rows) {
  case codegen::Rows::Sequence:
    return steps * batch;
  case codegen::Rows::Step:
    return batch;
  case codegen::Rows::Fixed:
    return spec.fixedRows;
  }
  return 0;
}

} // namespace

std::shared_ptr<CompiledCell> CompiledCell::compile(const ir::Cell& cell,
                                                    const CompileOptions& options) {
  auto start = std::chrono::steady_clock::now();
  auto compiled = std::make_shared<CompiledCell>();
  compiled->cell_ = cell.clone();
  std::ostringstream discarded;
  passes::runPipeline(*compiled->cell_, options.pipeline, options.log ? *options.log : discarded);
  compiled->plan_ = codegen::planStorage(*compiled->cell_);
  codegen::Target target = codegen::hostTarget();
  std::string key = cacheKey(*compiled->cell_, target);
  auto elapsed = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };

  MemoryCache& memory = memoryCache();
  if (options.memoryCache) {
    std::lock_guard<std::mutex> lock(memory.mutex);
    if (auto it = memory.cells.find(key); it != memory.cells.end())
      if (std::shared_ptr<CompiledCell> earlier = it->second.lock()) {
        compiled->function_ = earlier->function_;
        compiled->lifetime_ = earlier->lifetime_;
        compiled->source_ = CodeSource::MemoryCache;
        compiled->compileMs_ = elapsed();
        return compiled;
      }
  }

  std::optional<std::string> object;
  DiskCache disk(options.cache.directory);
  if (options.cache.disk)
    object = disk.load(key);
  compiled->source_ = object ? CodeSource::DiskCache : CodeSource::Compiled;
  if (!object) {
    object = codegen::generate(*compiled->cell_, compiled->plan_, target, codegen::Stage::Object);
    if (options.cache.disk)
      disk.store(key, *object);
  }
  codegen::Jit::Loaded loaded = processJit().load(*object, codegen::kRunFunctionName);
  compiled->function_ = reinterpret_cast<void (*)(const void*)>(loaded.address);
  compiled->lifetime_ = std::move(loaded.lifetime);
  compiled->compileMs_ = elapsed();
  if (options.memoryCache) {
    std::lock_guard<std::mutex> lock(memory.mutex);
    memory.cells[key] = compiled;
  }
  return compiled;
}

Tensor CompiledCell::run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                         std::vector<Tensor>& states) const {
  Tensor output;
  Workspace workspace;
  run(params, inputs, states, output, workspace);
  return output;
}

void CompiledCell::run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                       std::vector<Tensor>& states, Tensor& output, Workspace& workspace) const {
  const ir::Cell& cell = *cell_;
  RNNC_INTERNAL_CHECK(params.size() == cell.params.size(), "wrong number of parameters");
  RNNC_INTERNAL_CHECK(inputs.size() == cell.inputs.size(), "wrong number of inputs");
  RNNC_INTERNAL_CHECK(states.size() == cell.states.size(), "wrong number of states");
  const int64_t steps = inputs.at(0).dim(0), batch = inputs.at(0).dim(1);

  // Every buffer is fully written before it is read, so reused memory needs no clearing.
  workspace.buffers.resize(plan_.buffers.size());
  for (size_t i = 0; i < plan_.buffers.size(); ++i) {
    TensorShape shape{rowsFor(plan_.buffers[i], steps, batch), plan_.buffers[i].cols};
    if (workspace.buffers[i].shape() != shape)
      workspace.buffers[i] = Tensor(shape);
  }
  TensorShape outputShape{steps, batch, codegen::columnsOf(cell.output)};
  if (output.shape() != outputShape)
    output = Tensor(outputShape);

  std::vector<const float*> paramPtrs, inputPtrs;
  std::vector<float*> statePtrs, bufferPtrs;
  for (const Tensor& p : params)
    paramPtrs.push_back(p.data());
  for (const Tensor& in : inputs)
    inputPtrs.push_back(in.data());
  for (Tensor& s : states)
    statePtrs.push_back(s.data());
  for (Tensor& buffer : workspace.buffers)
    bufferPtrs.push_back(buffer.data());
  RnncRunArgs args{steps,
                   batch,
                   paramPtrs.data(),
                   inputPtrs.data(),
                   statePtrs.data(),
                   output.data(),
                   bufferPtrs.data()};
  function_(&args);
}

} // namespace rnnc
