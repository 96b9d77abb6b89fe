// A cell compiled for NVIDIA GPUs (issue 15): the optimised IR, its GPU storage plan and regions
// (codegen/GpuPlan.h), the kernels as PTX, and the same regions compiled for this machine.
//   - run() runs a sequence on the GPU through the CUDA driver (runtime/gpu/CudaDriver.h): the
//     parameter and pre regions once, then every step's regions, one kernel launch per region
//     (GpuSchedule::PerStep) or all steps in one persistent kernel whose blocks meet at a grid
//     barrier after each region (GpuSchedule::Persistent);
//   - emulate() runs the same regions on this machine, each region's GPU threads one after the
//     other, which is what the tests check against the interpreter where there is no GPU.
// Both have the interpreter's interface (inputs [T, B, F], states [B, F] updated to the final
// states, the outputs [T, B, H] returned).
#pragma once

#include "codegen/GpuPlan.h"
#include "codegen/StoragePlan.h"
#include "ir/Cell.h"
#include "passes/PassManager.h"
#include "runtime/data/Tensor.h"

#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

namespace rnnc {

enum class GpuSchedule { PerStep, Persistent };

class GpuCell {
public:
  struct Options {
    passes::PipelineOptions pipeline;
    std::ostream* log = nullptr; // where --print-after-all writes
    // sm_80 or sm_90; empty: the GPU's own where there is one, else sm_80.
    std::string gpu;
    // The block tiles' products (the input projection; a step's at large batches) on the tensor
    // cores, each as three TF32 products that keep fp32's accuracy ("3xTF32"); false: fp32 FMAs
    // (codegen::PackedProduct::tensorCores).
    bool tensorCores = true;
  };
  // `cell` must have all its sizes bound.
  static std::shared_ptr<GpuCell> compile(const ir::Cell& cell, const Options& options);
  ~GpuCell();

  // Generated on first use; the kernels for batches of kGpuBlockTiledBatch rows and more
  // (smaller ones run variants whose step products split their depth across a warp's lanes).
  const std::string& ptx() const;
  const std::string& ptxFor(int64_t batch) const { return forBatch(batch).ptx(); }
  const std::string& gpu() const { return gpu_; }
  const std::vector<codegen::GpuRegion>& regions() const { return regions_; }
  // The regions that run a batch of `batch` rows (those of the variant for it).
  const std::vector<codegen::GpuRegion>& regionsFor(int64_t batch) const {
    return forBatch(batch).regions_;
  }
  const ir::Cell& optimisedCell() const { return *cell_; }

  // On the GPU; UserError without one.
  Tensor run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
             std::vector<Tensor>& states, GpuSchedule schedule = GpuSchedule::PerStep) const;

  // Device memory for runs of one shape on the GPU, the parameters uploaded and their regions
  // run once: upload() the inputs and initial states, execute() (only the kernels: what a
  // benchmark times), download() the outputs and final states. Not thread-safe.
  class Resident {
  public:
    ~Resident();
    void upload(const std::vector<Tensor>& inputs, const std::vector<Tensor>& states) const;
    void execute(GpuSchedule schedule) const;
    Tensor download(std::vector<Tensor>& states) const;

  private:
    friend class GpuCell;
    Resident() = default;
    void launch(codegen::GpuPhase phase, GpuSchedule schedule) const;
    struct Memory;
    const GpuCell* cell_ = nullptr;
    int64_t steps_ = 0, batch_ = 0;
    TensorShape outputShape_;
    std::unique_ptr<Memory> memory_;
  };
  std::unique_ptr<Resident> resident(const std::vector<Tensor>& params,
                                     const std::vector<TensorShape>& inputShapes,
                                     const std::vector<TensorShape>& stateShapes) const;

  // On this machine: each region as `gpuThreads` GPU threads run it (a GPU's, not host
  // threads), thread after thread (`reversed`: from the last), the regions in the GPU's order.
  Tensor emulate(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                 std::vector<Tensor>& states, int64_t gpuThreads = 1000,
                 bool reversed = false) const;
  // The same with the steps run as the persistent kernel runs them: `blocks` host threads at
  // once, one GPU thread each, meeting at its grid barrier after every region.
  Tensor emulatePersistent(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                           std::vector<Tensor>& states, int blocks) const;

  // The floats buffer `spec` takes for a run of `steps` steps of `batch` rows.
  static int64_t bufferFloats(const codegen::BufferSpec& spec, int64_t steps, int64_t batch);

private:
  GpuCell() = default;
  void checkArguments(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& states) const;
  Tensor emulateWith(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                     std::vector<Tensor>& states, int64_t gpuThreads, bool reversed,
                     int persistentBlocks) const;
  struct DeviceCode;
  const DeviceCode& deviceCode() const; // the PTX loaded by the driver, once

  // The variant for a batch. From kGpuBlockTiledBatch rows, this one: a step's products in
  // block tiles of 32 rows. Below, split-depth warps (a block tile's rows past the batch would
  // be copies of the last, and too few blocks fill the GPU): in tiles of kGpuSplitDepthTileRows
  // rows (middle_), and below that of one row (narrow_; an LSTM at batch 1 ran 17% faster on an
  // H200 with one-row tiles than with 4-row ones).
  const GpuCell& forBatch(int64_t batch) const {
    if (!middle_ || batch >= codegen::kGpuBlockTiledBatch)
      return *this;
    return batch < codegen::kGpuSplitDepthTileRows ? *narrow_ : *middle_;
  }
  // The threads of every block of the persistent kernel: its step regions' block tiles' (all
  // the same), else kGpuDefaultBlockThreads.
  unsigned persistentBlockThreads() const;

  std::shared_ptr<ir::Cell> cell_;
  // Null where the step has no packed product (its plan is the same at every batch).
  std::shared_ptr<GpuCell> middle_, narrow_;
  codegen::StoragePlan plan_;
  std::vector<codegen::GpuRegion> regions_;
  std::string gpu_;
  bool tensorCores_ = true;
  mutable std::string ptx_;

  mutable std::once_flag ptxOnce_, emulationOnce_, deviceOnce_;
  mutable void (*emulate_)(const void*, int64_t, int64_t, int64_t, int64_t) = nullptr;
  mutable std::shared_ptr<void> emulationLifetime_;
  mutable std::unique_ptr<DeviceCode> device_;
};

} // namespace rnnc
