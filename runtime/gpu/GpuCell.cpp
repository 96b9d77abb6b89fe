#include "runtime/gpu/GpuCell.h"

#include "codegen/Compiler.h"
#include "codegen/GpuEmitter.h"
#include "codegen/RunArgs.h"
#include "ir/Error.h"
#include "runtime/exec/CellBuild.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/gpu/CudaDriver.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

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

// Threads per block of every launch but a block tile's (which has its own).
constexpr unsigned kGpuDefaultBlockThreads = 256;

unsigned launchBlockThreads(const codegen::GpuRegion& region) {
  const int64_t threads = region.blockThreads();
  return threads > 0 ? static_cast<unsigned>(threads) : kGpuDefaultBlockThreads;
}

constexpr codegen::GpuPhase kPhases[] = {codegen::GpuPhase::Params, codegen::GpuPhase::Pre,
                                         codegen::GpuPhase::Step, codegen::GpuPhase::Final};

// The regions of `phase` in the order a GPU runs them, as (region, step) pairs: the step
// regions at every step in turn, the others once.
template <class Visit>
void forEachLaunch(const std::vector<codegen::GpuRegion>& regions, codegen::GpuPhase phase,
                   int64_t steps, Visit&& visit) {
  const int64_t stepCount = phase == codegen::GpuPhase::Step ? steps : 1;
  for (int64_t t = 0; t < stepCount; ++t)
    for (size_t i = 0; i < regions.size(); ++i)
      if (regions[i].phase == phase)
        visit(i, t);
}

} // namespace

GpuCell::~GpuCell() = default;

std::shared_ptr<GpuCell> GpuCell::compile(const ir::Cell& cell, const Options& options) {
  auto compiled = std::shared_ptr<GpuCell>(new GpuCell);
  compiled->gpu_ = options.gpu;
  compiled->tensorCores_ = options.tensorCores;
  if (compiled->gpu_.empty())
    compiled->gpu_ = CudaDriver::unavailableReason().empty() ? CudaDriver::get().gpuArchitecture()
                                                             : std::string("sm_80");
  const codegen::Target target = codegen::gpuTarget(compiled->gpu_, options.tensorCores);
  compiled->cell_ = optimiseCell(cell, options.pipeline, options.log);
  auto plan = [&](GpuCell& variant, int64_t stepTileRows) {
    variant.plan_ = planCell(variant.cell_, target, codegen::WeightType::F32, stepTileRows).plan;
    variant.regions_ = codegen::planGpuRegions(*variant.cell_, variant.plan_);
  };
  plan(*compiled, codegen::kGpuStepBlockTiles);
  const std::vector<codegen::GpuRegion>& regions = compiled->regions_;
  if (std::any_of(regions.begin(), regions.end(), [](const codegen::GpuRegion& r) {
        return r.phase == codegen::GpuPhase::Step && r.kind == codegen::GpuRegion::Kind::Product;
      })) {
    auto variant = [&](int64_t stepTileRows) {
      auto smaller = std::shared_ptr<GpuCell>(new GpuCell);
      smaller->gpu_ = compiled->gpu_;
      smaller->tensorCores_ = compiled->tensorCores_;
      smaller->cell_ = compiled->cell_;
      plan(*smaller, stepTileRows);
      return smaller;
    };
    compiled->middle_ = variant(codegen::kGpuSplitDepthTileRows);
    compiled->narrow_ = variant(1);
  }
  return compiled;
}

const std::string& GpuCell::ptx() const {
  std::call_once(ptxOnce_, [&] {
    ptx_ = CellBuild{cell_, codegen::gpuTarget(gpu_, tensorCores_), codegen::WeightType::F32, plan_}
               .generate(codegen::Stage::Assembly);
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
                        std::vector<Tensor>& states, int64_t gpuThreads, bool reversed) const {
  return emulateWith(params, inputs, states, gpuThreads, reversed, 0);
}

Tensor GpuCell::emulatePersistent(const std::vector<Tensor>& params,
                                  const std::vector<Tensor>& inputs, std::vector<Tensor>& states,
                                  int blocks) const {
  RNNC_INTERNAL_CHECK(blocks >= 1, "at least one emulated block");
  return emulateWith(params, inputs, states, 1, false, blocks);
}

Tensor GpuCell::emulateWith(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                            std::vector<Tensor>& states, int64_t gpuThreads, bool reversed,
                            int persistentBlocks) const {
  checkArguments(params, inputs, states);
  if (const GpuCell& variant = forBatch(inputs[0].dim(1)); &variant != this)
    return variant.emulateWith(params, inputs, states, gpuThreads, reversed, persistentBlocks);
  RNNC_INTERNAL_CHECK(gpuThreads >= 1, "at least one emulated thread");
  std::call_once(emulationOnce_, [&] {
    std::string object = codegen::generateGpuEmulation(*cell_, plan_, codegen::Stage::Object);
    LoadedFunction loaded = loadGeneratedCode(object, codegen::kGpuEmulateFunction);
    emulate_ =
        reinterpret_cast<void (*)(const void*, int64_t, int64_t, int64_t, int64_t)>(loaded.address);
    emulationLifetime_ = std::move(loaded.lifetime);
  });
  const int64_t steps = inputs[0].dim(0), batch = inputs[0].dim(1);
  std::vector<Tensor> buffers;
  for (const codegen::BufferSpec& spec : plan_.buffers)
    buffers.emplace_back(TensorShape{bufferFloats(spec, steps, batch)});
  Tensor output({steps, batch, ir::columnsOf(cell_->output)});
  std::vector<const float*> paramPointers = dataPointers(params),
                            inputPointers = dataPointers(inputs);
  std::vector<float*> statePointers = mutableDataPointers(states),
                      bufferPointers = mutableDataPointers(buffers);
  // The persistent kernel's grid barrier counts on this, as the GPU's on its counter.
  alignas(8) int64_t counter = 0;
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
                   &counter,
                   nullptr, // dense inputs
                   0,
                   0, // no dropout masks (codegen/GpuPlan.cpp refuses them)
                   0};
  for (codegen::GpuPhase phase : kPhases) {
    if (phase == codegen::GpuPhase::Step && persistentBlocks > 0) {
      std::vector<std::thread> blocks;
      for (int block = 0; block < persistentBlocks; ++block)
        blocks.emplace_back([&, block] { emulate_(&args, -1, block, persistentBlocks, 0); });
      for (std::thread& t : blocks)
        t.join();
      continue;
    }
    forEachLaunch(regions_, phase, steps, [&](size_t region, int64_t step) {
      emulate_(&args, static_cast<int64_t>(region), step, gpuThreads, reversed ? 1 : 0);
    });
  }
  return output;
}

unsigned GpuCell::persistentBlockThreads() const {
  int64_t threads = 0; // none asked for yet
  for (const codegen::GpuRegion& region : regions_)
    if (region.phase == codegen::GpuPhase::Step && region.blockThreads() > 0) {
      RNNC_INTERNAL_CHECK(threads == 0 || threads == region.blockThreads(),
                          "a step's block tiles of different block sizes");
      threads = region.blockThreads();
    }
  return threads > 0 ? static_cast<unsigned>(threads) : kGpuDefaultBlockThreads;
}

const GpuCell::DeviceCode& GpuCell::deviceCode() const {
  std::call_once(deviceOnce_, [&] {
    const CudaDriver& driver = CudaDriver::get();
    auto code = std::make_unique<DeviceCode>();
    code->module = driver.loadModule(ptx());
    for (size_t i = 0; i < regions_.size(); ++i) {
      code->regionKernels.push_back(
          driver.function(code->module, codegen::kGpuKernelPrefix + std::to_string(i)));
      if (regions_[i].blockThreads() > 0)
        driver.preferSharedMemory(code->regionKernels.back());
    }
    code->persistent = driver.function(code->module, codegen::kGpuPersistentKernel);
    driver.preferSharedMemory(code->persistent);
    code->persistentBlocksPerMultiprocessor = driver.maxActiveBlocksPerMultiprocessor(
        code->persistent, static_cast<int>(persistentBlockThreads()));
    device_ = std::move(code);
  });
  return *device_;
}

// The device memory of runs of `steps` steps of `batch` rows, and the arguments that point
// into it.
struct GpuCell::Resident::Memory {
  std::vector<DeviceBuffer> owned;
  std::vector<CudaDriver::DevicePointer> params, inputs, states, buffers;
  CudaDriver::DevicePointer output = 0, args = 0, counter = 0;
};

GpuCell::Resident::~Resident() = default;

std::unique_ptr<GpuCell::Resident>
GpuCell::resident(const std::vector<Tensor>& params, const std::vector<TensorShape>& inputShapes,
                  const std::vector<TensorShape>& stateShapes) const {
  RNNC_INTERNAL_CHECK(params.size() == cell_->params.size(), "wrong number of parameters");
  RNNC_INTERNAL_CHECK(inputShapes.size() == cell_->inputs.size() && !inputShapes.empty() &&
                          inputShapes[0].size() == 3,
                      "inputs must be [T, B, F]");
  RNNC_INTERNAL_CHECK(stateShapes.size() == cell_->states.size(), "wrong number of states");
  if (const GpuCell& variant = forBatch(inputShapes[0][1]); &variant != this)
    return variant.resident(params, inputShapes, stateShapes);
  const CudaDriver& driver = CudaDriver::get();
  auto run = std::unique_ptr<Resident>(new Resident);
  run->cell_ = this;
  run->steps_ = inputShapes[0][0];
  run->batch_ = inputShapes[0][1];
  run->outputShape_ = {run->steps_, run->batch_, ir::columnsOf(cell_->output)};
  run->memory_ = std::make_unique<Resident::Memory>();
  Resident::Memory& m = *run->memory_;
  auto allocate = [&](size_t bytes) {
    m.owned.emplace_back(bytes);
    return m.owned.back().pointer();
  };
  auto upload = [&](const void* data, size_t bytes) {
    CudaDriver::DevicePointer p = allocate(bytes);
    driver.copyToDevice(p, data, bytes);
    return p;
  };
  auto floatBytes = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
  for (const Tensor& p : params)
    m.params.push_back(upload(p.data(), floatBytes(p.numel())));
  for (const TensorShape& shape : inputShapes)
    m.inputs.push_back(allocate(floatBytes(numElements(shape))));
  for (const TensorShape& shape : stateShapes)
    m.states.push_back(allocate(floatBytes(numElements(shape))));
  for (const codegen::BufferSpec& spec : plan_.buffers)
    m.buffers.push_back(allocate(floatBytes(bufferFloats(spec, run->steps_, run->batch_))));
  m.output = allocate(floatBytes(numElements(run->outputShape_)));
  auto pointerArray = [&](const std::vector<CudaDriver::DevicePointer>& pointers) {
    return upload(pointers.data(), pointers.size() * sizeof(CudaDriver::DevicePointer));
  };
  // The arguments as the kernels read them: RnncRunArgs with the GPU's addresses.
  auto address = [](CudaDriver::DevicePointer p) { return reinterpret_cast<void*>(p); };
  RnncRunArgs args{run->steps_,
                   run->batch_,
                   static_cast<const float* const*>(address(pointerArray(m.params))),
                   static_cast<const float* const*>(address(pointerArray(m.inputs))),
                   static_cast<float* const*>(address(pointerArray(m.states))),
                   static_cast<float*>(address(m.output)),
                   static_cast<float* const*>(address(pointerArray(m.buffers))),
                   0,
                   0,
                   1,
                   nullptr,
                   nullptr, // dense inputs
                   0,
                   0, // no dropout masks (codegen/GpuPlan.cpp refuses them)
                   0};
  m.args = upload(&args, sizeof args);
  m.counter = allocate(sizeof(int64_t));
  run->launch(codegen::GpuPhase::Params, GpuSchedule::PerStep);
  return run;
}

void GpuCell::Resident::upload(const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& states) const {
  const CudaDriver& driver = CudaDriver::get();
  RNNC_INTERNAL_CHECK(inputs.size() == memory_->inputs.size() &&
                          states.size() == memory_->states.size(),
                      "wrong number of inputs or states");
  for (size_t i = 0; i < inputs.size(); ++i)
    driver.copyToDevice(memory_->inputs[i], inputs[i].data(),
                        static_cast<size_t>(inputs[i].numel()) * sizeof(float));
  for (size_t s = 0; s < states.size(); ++s)
    driver.copyToDevice(memory_->states[s], states[s].data(),
                        static_cast<size_t>(states[s].numel()) * sizeof(float));
}

void GpuCell::Resident::execute(GpuSchedule schedule) const {
  for (codegen::GpuPhase phase : kPhases)
    if (phase != codegen::GpuPhase::Params) // done once, when the memory was set up
      launch(phase, schedule);
  CudaDriver::get().synchronize();
}

void GpuCell::Resident::launch(codegen::GpuPhase phase, GpuSchedule schedule) const {
  const CudaDriver& driver = CudaDriver::get();
  const DeviceCode& code = cell_->deviceCode();
  const std::vector<codegen::GpuRegion>& regions = cell_->regions_;
  CudaDriver::DevicePointer args = memory_->args, counter = memory_->counter;
  if (phase == codegen::GpuPhase::Step && schedule == GpuSchedule::Persistent && steps_ > 0) {
    if (!driver.cooperativeLaunch())
      throw UserError(fmt::format("GPU '{}' cannot launch cooperative kernels, which the "
                                  "persistent schedule needs: use the per-step one",
                                  driver.deviceName()));
    // As many blocks as the largest step region has work for, and no more than can be resident
    // at once (the grid barrier waits for all of them).
    const unsigned blockThreads = cell_->persistentBlockThreads();
    int64_t needed = 1;
    for (const codegen::GpuRegion& r : regions)
      if (r.phase == codegen::GpuPhase::Step)
        needed = std::max(needed, (r.threads(steps_, batch_) + blockThreads - 1) / blockThreads);
    const int64_t resident =
        static_cast<int64_t>(driver.multiprocessors()) * code.persistentBlocksPerMultiprocessor;
    if (resident < 1)
      throw UserError("the persistent kernel does not fit on this GPU");
    driver.zero(counter, sizeof(int64_t));
    void* arguments[] = {&args, &counter};
    driver.launchCooperative(code.persistent, static_cast<unsigned>(std::min(needed, resident)),
                             blockThreads, arguments);
    return;
  }
  const int64_t maxGrid = static_cast<int64_t>(driver.multiprocessors()) * 32;
  auto launchRegion = [&](size_t region, int64_t step) {
    const int64_t threads = regions[region].threads(steps_, batch_);
    if (threads == 0)
      return;
    void* arguments[] = {&args, &step};
    const unsigned blockThreads = launchBlockThreads(regions[region]);
    const int64_t grid =
        std::clamp<int64_t>((threads + blockThreads - 1) / blockThreads, 1, maxGrid);
    driver.launch(code.regionKernels[region], static_cast<unsigned>(grid), blockThreads, arguments);
  };
  forEachLaunch(regions, phase, steps_, launchRegion);
}

Tensor GpuCell::Resident::download(std::vector<Tensor>& states) const {
  const CudaDriver& driver = CudaDriver::get();
  Tensor output(outputShape_);
  driver.copyToHost(output.data(), memory_->output,
                    static_cast<size_t>(output.numel()) * sizeof(float));
  for (size_t s = 0; s < states.size(); ++s)
    driver.copyToHost(states[s].data(), memory_->states[s],
                      static_cast<size_t>(states[s].numel()) * sizeof(float));
  return output;
}

Tensor GpuCell::run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                    std::vector<Tensor>& states, GpuSchedule schedule) const {
  checkArguments(params, inputs, states);
  std::vector<TensorShape> inputShapes, stateShapes;
  for (const Tensor& x : inputs)
    inputShapes.push_back(x.shape());
  for (const Tensor& s : states)
    stateShapes.push_back(s.shape());
  std::unique_ptr<Resident> run = resident(params, inputShapes, stateShapes);
  run->upload(inputs, states);
  run->execute(schedule);
  return run->download(states);
}

} // namespace rnnc
