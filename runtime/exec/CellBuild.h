// The one road from a cell to code, taken by everything that compiles a cell: the JIT
// (CompiledCell), GPU cells (GpuCell), `rnnc compile` and the Python module's IR view.
//   optimiseCell: the pass pipeline, on a copy (what --print-after and --time-passes observe);
//   planCell:     the storage plan of the optimised cell for a target (tiles, buffers, layouts);
//   CellBuild::generate: LLVM IR, assembly or an object for a CPU, NVVM IR or PTX for a GPU;
//   CellBuild::load:     the object in this process, from the disk cache or generated and stored.
#pragma once

#include "codegen/Compiler.h"
#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "codegen/WeightType.h"
#include "ir/Cell.h"
#include "passes/PassManager.h"
#include "runtime/exec/CompileCache.h"
#include "runtime/exec/ObjectLoader.h"

#include <functional>
#include <memory>
#include <ostream>
#include <string>

namespace rnnc {

// `cell` through the pass pipeline, on a copy; what the options ask to print goes to `log`
// (nowhere when null).
std::shared_ptr<ir::Cell> optimiseCell(const ir::Cell& cell, const passes::PipelineOptions& options,
                                       std::ostream* log = nullptr);

// The cache key of code for `target`: the rnnc version, the code generator's sources, LLVM and
// the target, then `code` (what is compiled: a cell's IR and weight type, or the GEMM tile).
std::string codeCacheKey(const codegen::Target& target, const std::string& code);

// Code for `key` loaded into the process, its entry point `function`: from the disk cache
// (`cache`) where a verified entry loads (one that does not is deleted), else `generate()`d and
// stored there.
struct LoadedCode {
  LoadedFunction loaded;
  bool fromDisk = false;
};
LoadedCode loadOrGenerate(const CacheOptions& cache, const std::string& key,
                          const std::string& function,
                          const std::function<std::string()>& generate);

// An optimised cell (every size bound) planned for a target: all that code generation needs.
struct CellBuild {
  std::shared_ptr<ir::Cell> cell;
  codegen::Target target;
  codegen::WeightType weights = codegen::WeightType::F32;
  codegen::StoragePlan plan;
  double planMs = 0;           // what planning took (`rnnc compile --time-passes`)
  bool widenCachedFp16 = true; // codegen::planStorage's, which made `plan`

  // Everything the object depends on: the optimised IR (sizes included), the weight type, the
  // code generator's sources, LLVM and the target. Nothing runs LLVM to build it, so a cache hit
  // costs the passes, a file read and the load.
  std::string cacheKey() const;
  // The code at `stage`: for a CPU target codegen::generate (with its parts' times when
  // `times` is given), for a GPU target codegen::generateGpu.
  std::string generate(codegen::Stage stage, codegen::CodegenTimes* times = nullptr) const;
  // The object's run function in this process (a CPU target): from the disk cache or generated.
  LoadedCode load(const CacheOptions& cache) const;
};

// Plans `optimised` for `target`; `gpuStepTileRows` and `widenCachedFp16` as
// codegen::planStorage's.
CellBuild planCell(std::shared_ptr<ir::Cell> optimised, const codegen::Target& target,
                   codegen::WeightType weights = codegen::WeightType::F32,
                   int64_t gpuStepTileRows = codegen::kGpuStepBlockTiles,
                   bool widenCachedFp16 = true);

} // namespace rnnc
