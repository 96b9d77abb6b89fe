#include "codegen/GpuPlan.h"

#include "ir/Error.h"
#include "ir/Printer.h"

#include <algorithm>

namespace rnnc::codegen {

const char* gpuPhaseName(GpuPhase phase) {
  switch (phase) {
  case GpuPhase::Params:
    return "params";
  case GpuPhase::Pre:
    return "pre";
  case GpuPhase::Step:
    return "step";
  case GpuPhase::Final:
    return "final";
  }
  return "?";
}

int64_t GpuRegion::rowCount(int64_t steps, int64_t batch) const {
  switch (rows) {
  case Rows::Sequence:
    return steps * batch;
  case Rows::Step:
    return batch;
  default:
    return fixedRows;
  }
}

int64_t GpuRegion::items(int64_t steps, int64_t batch) const {
  return (rowCount(steps, batch) + rowsPerItem - 1) / rowsPerItem * itemsPerRow;
}

int64_t GpuRegion::threads(int64_t steps, int64_t batch) const {
  if (kind == Kind::Product && packed->blockTiled)
    return items(steps, batch) * packed->blockThreads;
  const bool warps = kind == Kind::Product && packed->splitDepth;
  return items(steps, batch) * (warps ? kGpuWarpLanes : 1);
}

std::string GpuRegion::describe(const ir::Cell& cell) const {
  std::string what;
  switch (kind) {
  case Kind::Kernel:
  case Kind::RowKernel:
  case Kind::Product:
  case Kind::Instruction: {
    const ir::Instr& first = *(*block)[unit.first];
    what = unit.last - unit.first > 1
               ? "kernel of " + std::to_string(unit.last - unit.first) + " ops from %" +
                     first.result.name + " (" + std::string(ir::opName(first.op)) + ")"
               : "%" + first.result.name + " (" + std::string(ir::opName(first.op)) + ")";
    if (kind == Kind::RowKernel)
      what += ", a row per item";
    if (kind == Kind::Product && packed->blockTiled)
      what += ", " + std::to_string(rowsPerItem) + " rows x " + std::to_string(packed->width) +
              " columns per block of " + std::to_string(packed->blockThreads) +
              " threads (through shared memory" +
              (packed->tensorCores ? ", on the tensor cores)" : ")");
    else if (kind == Kind::Product)
      what += ", " + std::to_string(rowsPerItem) + " rows x 1 column per " +
              (packed->splitDepth ? "warp (its lanes split the depth)" : "thread");
    break;
  }
  case Kind::Packing:
    what = "pack the weights of %" + packed->product->result.name;
    break;
  case Kind::StepOutputs:
    what = "output rows and staged next states";
    break;
  case Kind::StepStates:
    what = "state updates";
    break;
  case Kind::FinalStates:
    what = "final states from the last output rows";
    break;
  }
  return std::string(gpuPhaseName(phase)) + ": " + what;
}

namespace {

// The rows a value's work covers in a phase: the run's (batched) or its fixed ones.
void setRows(GpuRegion& region, const ir::Value* value) {
  if (value->isBatched()) {
    region.rows = region.phase == GpuPhase::Pre ? Rows::Sequence : Rows::Step;
  } else {
    region.rows = Rows::Fixed;
    region.fixedRows = fixedRowsOf(value);
  }
}

GpuRegion unitRegion(const ir::Block& block, const WorkUnit& unit, GpuPhase phase) {
  GpuRegion region;
  region.phase = phase;
  region.block = &block;
  region.unit = unit;
  region.packed = unit.packed;
  const ir::Instr& first = *block[unit.first];
  if (unit.packed) {
    region.kind = GpuRegion::Kind::Product;
    setRows(region, first.operands[0]);
    region.rowsPerItem = unit.packed->tileRows;
    // A block tile's item is a block of columns, any other product's one column.
    region.itemsPerRow = unit.packed->blockTiled ? unit.packed->blocks : unit.packed->columns;
    return region;
  }
  if (unit.kernel) {
    const KernelSpace space = kernelSpace(block, {unit.first, unit.last});
    region.kind = space.normalises ? GpuRegion::Kind::RowKernel : GpuRegion::Kind::Kernel;
    if (space.batched) {
      region.rows = phase == GpuPhase::Pre ? Rows::Sequence : Rows::Step;
    } else {
      region.rows = Rows::Fixed;
      region.fixedRows = space.fixedRows;
    }
    region.itemsPerRow = space.normalises ? 1 : space.cols;
    return region;
  }
  region.kind = GpuRegion::Kind::Instruction;
  switch (first.op) {
  case ir::Op::Linear:
  case ir::Op::MatMul:
    setRows(region, first.operands[0]);
    region.itemsPerRow = columnsOf(&first.result);
    break;
  case ir::Op::LayerNorm:
  case ir::Op::LayerNormGrad:
    setRows(region, first.operands[0]);
    break;
  case ir::Op::DropoutMask:
    throw UserError("dropout in training mode runs on the CPU (the JIT or the interpreter): the "
                    "GPU's code draws no dropout masks");
  case ir::Op::Concat:
  case ir::Op::Stack:
    setRows(region, &first.result);
    region.itemsPerRow = columnsOf(&first.result);
    break;
  // Elementwise ops run in kernels (the branch above), slices and constants are views.
  case ir::Op::Const:
  case ir::Op::Slice:
  case ir::Op::Add:
  case ir::Op::Sub:
  case ir::Op::Mul:
  case ir::Op::Div:
  case ir::Op::Min:
  case ir::Op::Max:
  case ir::Op::Neg:
  case ir::Op::Sigmoid:
  case ir::Op::Tanh:
  case ir::Op::Relu:
  case ir::Op::Exp:
  case ir::Op::Log:
  case ir::Op::Sqrt:
  case ir::Op::Clamp:
  case ir::Op::Dropout:
  case ir::Op::Step:
    RNNC_INTERNAL_CHECK(false, "no GPU region for " + std::string(ir::opName(first.op)));
  }
  return region;
}

} // namespace

std::vector<GpuRegion> planGpuRegions(const ir::Cell& cell, const StoragePlan& plan) {
  std::vector<GpuRegion> regions;
  const std::vector<WorkUnit> pre = workUnits(cell.pre, plan);
  for (const WorkUnit& unit : pre)
    if (unit.unbatched)
      regions.push_back(unitRegion(cell.pre, unit, GpuPhase::Params));
  for (const PackedProduct& packed : plan.packedProducts) {
    GpuRegion packing;
    packing.kind = GpuRegion::Kind::Packing;
    packing.phase = GpuPhase::Params;
    packing.packed = &packed;
    packing.itemsPerRow = packed.blocks * packed.packedDepth() * packed.width; // all slices
    regions.push_back(packing);
  }
  for (const WorkUnit& unit : pre)
    if (!unit.unbatched)
      regions.push_back(unitRegion(cell.pre, unit, GpuPhase::Pre));
  for (const WorkUnit& unit : workUnits(cell.step, plan))
    regions.push_back(unitRegion(cell.step, unit, GpuPhase::Step));

  // The end of a step, as the CPU's (CellEmitter::emitStep): what reads the states before
  // anything overwrites them.
  const int64_t outCols = columnsOf(cell.output);
  GpuRegion outputs{GpuRegion::Kind::StepOutputs, GpuPhase::Step};
  outputs.rows = Rows::Step;
  outputs.itemsPerRow = plan.outputInPlace ? 0 : outCols;
  GpuRegion states{GpuRegion::Kind::StepStates, GpuPhase::Step};
  states.rows = Rows::Step;
  states.itemsPerRow = 0;
  GpuRegion finals{GpuRegion::Kind::FinalStates, GpuPhase::Final};
  finals.rows = Rows::Step;
  finals.itemsPerRow = 0;
  for (size_t i = 0; i < cell.updates.size(); ++i) {
    const int64_t width = columnsOf(cell.states[i].get());
    if (plan.updatedInKernel[i])
      continue;
    if (plan.staging[i] >= 0)
      outputs.itemsPerRow = std::max(outputs.itemsPerRow, width);
    if (plan.readFromOutput[i])
      finals.itemsPerRow = std::max(finals.itemsPerRow, width);
    else if (cell.updates[i].next != cell.updates[i].state)
      states.itemsPerRow = std::max(states.itemsPerRow, width);
  }
  for (const GpuRegion& end : {outputs, states, finals})
    if (end.itemsPerRow > 0)
      regions.push_back(end);
  return regions;
}

} // namespace rnnc::codegen
