#include "runtime/GpuCell.h"

#include "codegen/Compiler.h"
#include "codegen/GpuEmitter.h"
#include "codegen/Jit.h"
#include "codegen/RunArgs.h"
#include "ir/Error.h"
#include "runtime/CompiledCell.h"
#include "runtime/CudaDriver.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

namespace rnnc {

// The PTX loaded by the driver and its kernels.
struct GpuCell::DeviceCode {
  CudaDriver::Module module = nullptr;
  std::vector<CudaDriver::Function> regionKernels;
  CudaDriver::Function persistent = nullptr;
  int persistentBlocksPerMultiprocessor = 0;
  ~DeviceCode() {
    if (module)
      CudaDriver::get().unloadModule(module);
  }
};

namespace {

constexpr unsigned kBlockSize = 256; // threads per block of every launch

// A run's regions in the order they run: (region, step) pairs, steps spelled out.
template <class Visit>
void forEachLaunch(const std::vector<codegen::GpuRegion>& regions, int64_t steps, Visit&& visit,
                   bool stepsTogether = false) {
  using codegen::GpuPhase;
  for (GpuPhase phase : {GpuPhase::Params, GpuPhase::Pre})
    for (size_t i = 0; i < regions.size(); ++i)
      if (regions[i].phase == phase)
        visit(i, int64_t{0});
  if (stepsTogether) {
    visit(regions.size(), int64_t{-1}); // the persistent kernel, all steps
  } else {
    for (int64_t t = 0; t < steps; ++t)
      for (size_t i = 0; i < regions.size(); ++i)
        if (regions[i].phase == GpuPhase::Step)
          visit(i, t);
  }
  for (size_t i = 0; i < regions.size(); ++i)
    if (regions[i].phase == GpuPhase::Final)
      visit(i, int64_t{0});
}

} // namespace

GpuCell::~GpuCell() = default;

std::shared_ptr<GpuCell> GpuCell::compile(const ir::Cell& cell, const Options& options) {
  auto compiled = std::shared_ptr<GpuCell>(new GpuCell);
  compiled->gpu_ = options.gpu;
  if (compiled->gpu_.empty())
    compiled->gpu_ = CudaDriver::unavailableReason().empty() ? CudaDriver::get().gpuArchitecture()
                                                             : std::string("sm_80");
  const codegen::Target target = codegen::gpuTarget(compiled->gpu_);
  compiled->cell_ = cell.clone();
  std::ostringstream discarded;
  passes::runPipeline(*compiled->cell_, options.pipeline, options.log ? *options.log : discarded);
  compiled->plan_ = codegen::planStorage(*compiled->cell_, target);
  compiled->regions_ = codegen::planGpuRegions(*compiled->cell_, compiled->plan_);
  return compiled;
}

const std::string& GpuCell::ptx() const {
  std::call_once(ptxOnce_, [&] {
    ptx_ = codegen::generateGpu(*cell_, plan_, codegen::gpuTarget(gpu_), codegen::Stage::Assembly);
  });
  return ptx_;
}

int64_t GpuCell::bufferFloats(const codegen::BufferSpec& spec, int64_t steps, int64_t batch) {
  switch (spec.rows) {
  case codegen::Rows::Fixed:
    return spec.floatsFor(spec.fixedRows);
  case codegen::Rows::Sequence:
    return spec.floatsFor(steps * batch);
  case codegen::Rows::Step:
    return spec.floatsFor(batch);
  case codegen::Rows::PerThread:
  case codegen::Rows::PerThreadStep:
    break;
  }
  RNNC_INTERNAL_CHECK(false, "a per-thread buffer in a GPU plan");
  return 0;
}

void GpuCell::checkArguments(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& states) const {
  RNNC_INTERNAL_CHECK(params.size() == cell_->params.size(), "wrong number of parameters");
  RNNC_INTERNAL_CHECK(inputs.size() == cell_->inputs.size(), "wrong number of inputs");
  RNNC_INTERNAL_CHECK(states.size() == cell_->states.size(), "wrong number of states");
  RNNC_INTERNAL_CHECK(!inputs.empty() && inputs[0].rank() == 3, "inputs must be [T, B, F]");
}

Tensor GpuCell::emulate(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                        std::vector<Tensor>& states, int64_t threads, bool reversed) const {
  checkArguments(params, inputs, states);
  RNNC_INTERNAL_CHECK(threads >= 1, "at least one emulated thread");
  std::call_once(emulationOnce_, [&] {
    std::string object = codegen::generateGpuEmulation(*cell_, plan_, codegen::Stage::Object);
    codegen::Jit::Loaded loaded = processJit().load(object, codegen::kGpuEmulateFunction);
    emulate_ =
        reinterpret_cast<void (*)(const void*, int64_t, int64_t, int64_t, int64_t)>(loaded.address);
    emulationLifetime_ = std::move(loaded.lifetime);
  });
  const int64_t steps = inputs[0].dim(0), batch = inputs[0].dim(1);
  std::vector<Tensor> buffers;
  for (const codegen::BufferSpec& spec : plan_.buffers)
    buffers.emplace_back(TensorShape{bufferFloats(spec, steps, batch)});
  Tensor output({steps, batch, codegen::columnsOf(cell_->output)});
  std::vector<const float*> paramPointers, inputPointers;
  std::vector<float*> statePointers, bufferPointers;
  for (const Tensor& p : params)
    paramPointers.push_back(p.data());
  for (const Tensor& x : inputs)
    inputPointers.push_back(x.data());
  for (Tensor& s : states)
    statePointers.push_back(s.data());
  for (Tensor& b : buffers)
    bufferPointers.push_back(b.data());
  RnncRunArgs args{steps,
                   batch,
                   paramPointers.data(),
                   inputPointers.data(),
                   statePointers.data(),
                   output.data(),
                   bufferPointers.data(),
                   0,
                   0,
                   1,
                   nullptr};
  forEachLaunch(regions_, steps, [&](size_t region, int64_t step) {
    emulate_(&args, static_cast<int64_t>(region), step, threads, reversed ? 1 : 0);
  });
  return output;
}

const GpuCell::DeviceCode& GpuCell::deviceCode() const {
  std::call_once(deviceOnce_, [&] {
    const CudaDriver& driver = CudaDriver::get();
    auto code = std::make_unique<DeviceCode>();
    code->module = driver.loadModule(ptx());
    for (size_t i = 0; i < regions_.size(); ++i)
      code->regionKernels.push_back(
          driver.function(code->module, codegen::kGpuKernelPrefix + std::to_string(i)));
    code->persistent = driver.function(code->module, codegen::kGpuPersistentKernel);
    code->persistentBlocksPerMultiprocessor =
        driver.maxActiveBlocksPerMultiprocessor(code->persistent, static_cast<int>(kBlockSize));
    device_ = std::move(code);
  });
  return *device_;
}

Tensor GpuCell::run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                    std::vector<Tensor>& states, GpuSchedule schedule) const {
  checkArguments(params, inputs, states);
  const CudaDriver& driver = CudaDriver::get();
  const DeviceCode& code = deviceCode();
  const int64_t steps = inputs[0].dim(0), batch = inputs[0].dim(1);
  const int64_t outCols = codegen::columnsOf(cell_->output);

  std::vector<DeviceBuffer> owned; // everything this run allocates on the GPU
  auto upload = [&](const void* data, size_t bytes) {
    owned.emplace_back(bytes);
    driver.copyToDevice(owned.back().pointer(), data, bytes);
    return owned.back().pointer();
  };
  auto floatBytes = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
  auto uploadAll = [&](const std::vector<Tensor>& tensors) {
    std::vector<CudaDriver::DevicePointer> pointers;
    for (const Tensor& t : tensors)
      pointers.push_back(upload(t.data(), floatBytes(t.numel())));
    return pointers;
  };
  std::vector<CudaDriver::DevicePointer> paramPointers = uploadAll(params),
                                         inputPointers = uploadAll(inputs),
                                         statePointers = uploadAll(states), bufferPointers;
  for (const codegen::BufferSpec& spec : plan_.buffers) {
    owned.emplace_back(floatBytes(bufferFloats(spec, steps, batch)));
    bufferPointers.push_back(owned.back().pointer());
  }
  owned.emplace_back(floatBytes(steps * batch * outCols));
  const CudaDriver::DevicePointer output = owned.back().pointer();
  auto pointerArray = [&](const std::vector<CudaDriver::DevicePointer>& pointers) {
    return upload(pointers.data(), pointers.size() * sizeof(CudaDriver::DevicePointer));
  };
  // The arguments as the kernels read them: RnncRunArgs with the GPU's addresses.
  auto address = [](CudaDriver::DevicePointer p) { return reinterpret_cast<void*>(p); };
  RnncRunArgs hostArgs{steps,
                       batch,
                       static_cast<const float* const*>(address(pointerArray(paramPointers))),
                       static_cast<const float* const*>(address(pointerArray(inputPointers))),
                       static_cast<float* const*>(address(pointerArray(statePointers))),
                       static_cast<float*>(address(output)),
                       static_cast<float* const*>(address(pointerArray(bufferPointers))),
                       0,
                       0,
                       1,
                       nullptr};
  CudaDriver::DevicePointer args = upload(&hostArgs, sizeof hostArgs);
  owned.emplace_back(sizeof(int64_t));
  const CudaDriver::DevicePointer counter = owned.back().pointer();

  const bool together = schedule == GpuSchedule::Persistent;
  if (together && !driver.cooperativeLaunch())
    throw UserError(fmt::format("GPU '{}' cannot launch cooperative kernels, which the persistent "
                                "schedule needs: use the per-step one",
                                driver.deviceName()));
  const int64_t maxGrid = static_cast<int64_t>(driver.multiprocessors()) * 32;
  forEachLaunch(
      regions_, steps,
      [&](size_t region, int64_t step) {
        if (region == regions_.size()) { // all steps in the persistent kernel
          int64_t needed = 1;
          for (const codegen::GpuRegion& r : regions_)
            if (r.phase == codegen::GpuPhase::Step)
              needed = std::max(needed, (r.items(steps, batch) + kBlockSize - 1) / kBlockSize);
          const int64_t resident = static_cast<int64_t>(driver.multiprocessors()) *
                                   code.persistentBlocksPerMultiprocessor;
          if (resident < 1)
            throw UserError("the persistent kernel does not fit on this GPU");
          driver.zero(counter, sizeof(int64_t));
          void* arguments[] = {const_cast<CudaDriver::DevicePointer*>(&args),
                               const_cast<CudaDriver::DevicePointer*>(&counter)};
          driver.launchCooperative(code.persistent,
                                   static_cast<unsigned>(std::min(needed, resident)), kBlockSize,
                                   arguments);
          return;
        }
        const int64_t items = regions_[region].items(steps, batch);
        if (items == 0)
          return;
        int64_t t = step;
        void* arguments[] = {const_cast<CudaDriver::DevicePointer*>(&args), &t};
        const int64_t grid = std::clamp<int64_t>((items + kBlockSize - 1) / kBlockSize, 1, maxGrid);
        driver.launch(code.regionKernels[region], static_cast<unsigned>(grid), kBlockSize,
                      arguments);
      },
      together && steps > 0);
  driver.synchronize();
  Tensor result({steps, batch, outCols});
  driver.copyToHost(result.data(), output, floatBytes(result.numel()));
  for (size_t s = 0; s < states.size(); ++s)
    driver.copyToHost(states[s].data(), statePointers[s], floatBytes(states[s].numel()));
  return result;
}

} // namespace rnnc
