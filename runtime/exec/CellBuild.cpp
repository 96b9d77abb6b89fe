#include "runtime/exec/CellBuild.h"

#include "codegen/HostTarget.h"
#include "codegen/RunArgs.h"
#include "ir/Error.h"
#include "ir/Printer.h"

#include <chrono>
#include <optional>
#include <sstream>

namespace rnnc {

std::shared_ptr<ir::Cell> optimiseCell(const ir::Cell& cell, const passes::PipelineOptions& options,
                                       std::ostream* log) {
  std::shared_ptr<ir::Cell> optimised = cell.clone();
  std::ostringstream discarded;
  passes::runPipeline(*optimised, options, log ? *log : discarded);
  return optimised;
}

std::string codeCacheKey(const codegen::Target& target, const std::string& code) {
  return codegen::codeGeneratorVersion() + "\ntarget " + target.describe() + "\n" + code;
}

LoadedCode loadOrGenerate(const CacheOptions& cache, const std::string& key,
                          const std::string& function,
                          const std::function<std::string()>& generate) {
  std::optional<DiskCache> disk;
  if (cache.disk)
    disk.emplace(cache.directory);
  if (disk)
    if (std::optional<std::string> object = disk->load(key)) {
      try {
        return {loadGeneratedCode(*object, function), true};
      } catch (const std::exception&) {
        disk->remove(key); // verified but not loadable: rebuilt below, not failing every run
      }
    }
  std::string object = generate();
  if (disk)
    disk->store(key, object);
  return {loadGeneratedCode(object, function), false};
}

std::string CellBuild::cacheKey() const {
  const bool keptFp16 = weights == codegen::WeightType::F16 && !widenCachedFp16;
  return codeCacheKey(target, "weights " + std::string(codegen::weightTypeName(weights)) +
                                  (keptFp16 ? " kept\n" : "\n") + ir::toString(*cell));
}

std::string CellBuild::generate(codegen::Stage stage, codegen::CodegenTimes* times) const {
  if (target.isGpu())
    return codegen::generateGpu(*cell, plan, target, stage);
  return codegen::generate(*cell, plan, target, stage, times);
}

LoadedCode CellBuild::load(const CacheOptions& cache) const {
  RNNC_INTERNAL_CHECK(!target.isGpu(), "a GPU's code is not loaded into this process");
  return loadOrGenerate(cache, cacheKey(), codegen::kRunFunctionName,
                        [&] { return generate(codegen::Stage::Object); });
}

CellBuild planCell(std::shared_ptr<ir::Cell> optimised, const codegen::Target& target,
                   codegen::WeightType weights, int64_t gpuStepTileRows, bool widenCachedFp16) {
  const auto start = std::chrono::steady_clock::now();
  CellBuild build;
  build.plan = codegen::planStorage(*optimised, target, weights, gpuStepTileRows, widenCachedFp16);
  build.planMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  build.cell = std::move(optimised);
  build.target = target;
  build.weights = weights;
  build.widenCachedFp16 = widenCachedFp16;
  return build;
}

} // namespace rnnc
