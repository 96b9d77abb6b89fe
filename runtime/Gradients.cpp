#include "runtime/Gradients.h"

#include "codegen/StoragePlan.h"
#include "ir/Error.h"
#include "passes/Autodiff.h"

#include <Eigen/Core>
#include <fmt/format.h>

#include <cstring>

namespace rnnc {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRows = Eigen::Map<const RowMajor>;

// The derived cells of one layer and direction, ready to run.
struct SlotGradient {
  std::unique_ptr<ir::Cell> forward; // the training forward (passes::withEnteringStates)
  passes::BackwardCell backward;
  std::shared_ptr<const CompiledCell> forwardCode, backwardCode; // null: the interpreter
  std::shared_ptr<const CompiledCell::Prepared> forwardPrepared, backwardPrepared;
  std::shared_ptr<const Interpreter> forwardInterpreter, backwardInterpreter;

  // What the training forward kept.
  Tensor input;                // the cell's inputs side by side, [T, B, sum of widths]
  std::vector<int64_t> widths; // of each input
  std::vector<Tensor> states;  // per state: the value entering each step, [T, B, F]
};

Executor executor(const std::shared_ptr<const CompiledCell>& code,
                  const std::shared_ptr<const CompiledCell::Prepared>& prepared,
                  const std::shared_ptr<const Interpreter>& interpreter, int threads,
                  std::vector<int64_t> widths) {
  return code ? jitExecutor(code, prepared, threads, std::move(widths))
              : interpreterExecutor(interpreter, std::move(widths));
}

// Columns [offset, offset + width) of a [T, B, F] tensor.
Tensor columns(const Tensor& t, int64_t offset, int64_t width) {
  Tensor out({t.dim(0), t.dim(1), width});
  for (int64_t r = 0; r < t.dim(0) * t.dim(1); ++r)
    std::memcpy(row(out, r), row(t, r) + offset, static_cast<size_t>(width) * sizeof(float));
  return out;
}

void addInto(Tensor& to, const Tensor& from) {
  RNNC_INTERNAL_CHECK(to.numel() == from.numel(), "gradient shapes differ");
  for (int64_t i = 0; i < to.numel(); ++i)
    to.data()[i] += from.data()[i];
}

int64_t constantOf(const ir::Dim& d) {
  RNNC_INTERNAL_CHECK(d.isConstant(), "unbound size in a gradient segment: " + d.str());
  return d.constantValue();
}

} // namespace

std::string initialStateGradientName(const std::string& state) {
  return state == "h" || state == "c" ? state + "0" : state;
}

GradientResult runGradients(const ir::Cell& cell, const GradientRequest& request,
                            const LayerOptions& options) {
  RNNC_INTERNAL_CHECK(request.weights, "no weights given");
  if (options.training && ir::containsOp(cell, ir::Op::Dropout))
    throw UserError(fmt::format("cell '{}' has dropout inside the cell; gradients in training "
                                "mode run without it for now (dropout between layers works)",
                                cell.name));
  // The layer program binds every slot's sizes and parameters; the cells that run are derived.
  LayerOptions bindOnly = options;
  bindOnly.engine = Engine::Interpreter;
  auto program = LayerProgram::build(cell, *request.weights, request.weightsSource, bindOnly);
  const int directions = program->numDirections(), layers = program->numLayers();
  const int threads = options.threads;

  std::vector<SlotGradient> slots;
  for (const LayerProgram::Slot& slot : program->slots()) {
    SlotGradient s;
    s.forward = passes::withEnteringStates(*slot.bound);
    s.backward = passes::deriveBackward(*slot.bound);
    if (options.engine == Engine::Jit) {
      s.forwardCode = CompiledCell::compile(*s.forward, options.compile);
      s.forwardPrepared = s.forwardCode->prepare(slot.params, threads);
      s.backwardCode = CompiledCell::compile(*s.backward.cell, options.compile);
      s.backwardPrepared = s.backwardCode->prepare(slot.params, threads);
    } else {
      s.forwardInterpreter = std::make_shared<Interpreter>(*s.forward, slot.params);
      s.backwardInterpreter = std::make_shared<Interpreter>(*s.backward.cell, slot.params);
    }
    slots.push_back(std::move(s));
  }

  // The training forward: the layer runner (checks, sorting, directions, dropout between
  // layers, batch_first) with each slot run by its training cell, keeping its inputs and the
  // states entering each step.
  auto trainingRun = [&](int64_t index, const Tensor& input, const std::vector<int64_t>& widths,
                         std::vector<Tensor> states, const std::vector<int64_t>& lengths,
                         bool reverse) {
    SlotGradient& s = slots[static_cast<size_t>(index)];
    DirectionRun out = runDirection(
        executor(s.forwardCode, s.forwardPrepared, s.forwardInterpreter, threads, widths), input,
        std::move(states), lengths, reverse);
    s.input = input;
    s.widths = widths;
    const ir::Cell& bound = *program->slots()[static_cast<size_t>(index)].bound;
    int64_t offset = codegen::columnsOf(bound.output);
    s.states.clear();
    for (const auto& state : bound.states) {
      int64_t width = codegen::columnsOf(state.get());
      s.states.push_back(columns(out.output, offset, width));
      offset += width;
    }
    out.output = columns(out.output, 0, codegen::columnsOf(bound.output));
    return out;
  };
  GradientResult result;
  result.forward = program->run(request.input, request.initialStates, request.lengths,
                                request.sideInputs, trainingRun);

  const Tensor& firstInput = slots[0].input;
  const int64_t steps = firstInput.dim(0), batch = firstInput.dim(1);
  std::vector<int64_t> lengths = checkedLengths(request.lengths, steps, batch);
  const int64_t slotCount = static_cast<int64_t>(slots.size());

  // dLoss/d(output) in [T, B, D*H], checked.
  const TensorShape outputShape = result.forward.output.shape();
  Tensor gradOutput;
  if (request.gradOutput.rank() == 0) { // none given
    gradOutput = Tensor({steps, batch, outputShape[2]});
  } else {
    if (request.gradOutput.shape() != outputShape)
      throw UserError(fmt::format("the output gradient has shape {}, expected the output's {}",
                                  request.gradOutput.shapeString(), shapeToString(outputShape)));
    gradOutput = options.batchFirst ? swapLeadingDims(request.gradOutput) : request.gradOutput;
  }
  for (const auto& [name, tensor] : request.gradFinalStates) {
    auto it = result.forward.finalStates.find(name);
    if (it == result.forward.finalStates.end())
      throw UserError(fmt::format("a final-state gradient is given for '{}', but cell '{}' has "
                                  "no state of that name",
                                  name, cell.name));
    if (tensor.shape() != it->second.shape())
      throw UserError(fmt::format("the gradient of final state '{}' has shape {}, expected {}",
                                  name, tensor.shapeString(), it->second.shapeString()));
  }

  TensorMap& grads = result.gradients;
  for (const auto& state : cell.states)
    grads[initialStateGradientName(state->name)] =
        Tensor({slotCount, batch, program->stateSize(state->name)});

  Tensor gradLayerOutput = std::move(gradOutput); // dLoss/d(this layer's output), [T, B, D*H]
  for (int layer = layers - 1; layer >= 0; --layer) {
    Tensor gradLayerInput;
    for (int direction = 0; direction < directions; ++direction) {
      const int64_t index = layer * directions + direction;
      SlotGradient& s = slots[static_cast<size_t>(index)];
      const LayerProgram::Slot& slot = program->slots()[static_cast<size_t>(index)];
      const int64_t outWidth = codegen::columnsOf(slot.bound->output);

      // The backward step's inputs side by side: the cell's inputs, the states entering each
      // step, the output gradient of this direction.
      std::vector<const Tensor*> parts = {&s.input};
      std::vector<int64_t> widths = s.widths;
      for (const Tensor& state : s.states) {
        parts.push_back(&state);
        widths.push_back(state.dim(2));
      }
      Tensor gradOut = columns(gradLayerOutput, direction * outWidth, outWidth);
      parts.push_back(&gradOut);
      widths.push_back(outWidth);
      std::vector<Tensor> gradStates;
      for (const auto& state : slot.bound->states) {
        int64_t features = codegen::columnsOf(state.get());
        auto it = request.gradFinalStates.find(state->name);
        gradStates.push_back(
            it == request.gradFinalStates.end()
                ? Tensor({batch, features})
                : Tensor({batch, features},
                         std::vector<float>(row(it->second, index * batch),
                                            row(it->second, (index + 1) * batch))));
      }
      // Backwards in time: from each sequence's end for the forward direction, from its start
      // for the reverse one.
      DirectionRun back = runDirection(
          executor(s.backwardCode, s.backwardPrepared, s.backwardInterpreter, threads, widths),
          concatFeatures(parts), std::move(gradStates), lengths, direction == 0);
      for (size_t k = 0; k < slot.bound->states.size(); ++k) {
        Tensor& all = grads.at(initialStateGradientName(slot.bound->states[k]->name));
        std::memcpy(row(all, index * batch), back.final[k].data(),
                    static_cast<size_t>(back.final[k].numel()) * sizeof(float));
      }

      // The segments of the per-step output: input gradients, parameter gradient factors.
      const Tensor& o = back.output; // [T, B, W], zero past each length
      ConstRows rows(o.data(), steps * batch, o.dim(2));
      int inputIndex = 0;
      for (const passes::GradientSegment& seg : s.backward.segments) {
        const int64_t at = constantOf(seg.offset), width = constantOf(seg.width);
        using Kind = passes::GradientSegment::Kind;
        if (seg.kind == Kind::Input) {
          Tensor g = columns(o, at, width);
          bool layerInput = inputIndex++ == 0;
          std::string name = layerInput ? "input" : seg.name;
          if (layerInput) {
            if (gradLayerInput.numel() == 0 || gradLayerInput.rank() != 3)
              gradLayerInput = std::move(g);
            else
              addInto(gradLayerInput, g);
          } else if (!grads.count(name)) {
            grads[name] = std::move(g);
          } else {
            addInto(grads[name], g);
          }
          continue;
        }
        // The parameter's name in the weights; none for a bias a bias-free file lacks.
        size_t p = 0;
        while (p < slot.bound->params.size() && slot.bound->params[p]->name != seg.name)
          ++p;
        RNNC_INTERNAL_CHECK(p < slot.params.size(), "no parameter " + seg.name);
        const std::string& name = slot.paramNames[p];
        if (!request.weights->count(name))
          continue;
        const Tensor& weight = slot.params[p];
        auto [it, fresh] = grads.emplace(name, Tensor(weight.shape()));
        Eigen::Map<RowMajor> dW(it->second.data(), weight.shape()[0],
                                weight.rank() == 2 ? weight.shape()[1] : 1);
        auto g = rows.middleCols(at, width);
        if (seg.kind == Kind::VectorWeight) {
          dW.col(0) += g.colwise().sum().transpose();
          continue;
        }
        auto a = rows.middleCols(constantOf(seg.operandOffset), constantOf(seg.operandWidth));
        if (seg.kind == Kind::LinearWeight)
          dW.noalias() += g.transpose() * a; // [N, K]
        else
          dW.noalias() += a.transpose() * g; // [K, N]
      }
    }
    // Down a layer: through the dropout between layers, as the forward applied it.
    if (layer > 0 && options.training && options.dropout > 0) {
      Tensor mask({steps, batch, gradLayerInput.dim(2)}, 1.0f);
      dropoutBetweenLayers(mask, options.dropout, options.seed, layer - 1);
      for (int64_t i = 0; i < mask.numel(); ++i)
        gradLayerInput.data()[i] *= mask.data()[i];
    }
    gradLayerOutput = std::move(gradLayerInput);
  }
  grads["input"] = options.batchFirst ? swapLeadingDims(gradLayerOutput) : gradLayerOutput;
  for (auto& [name, tensor] : grads)
    if (request.sideInputs.count(name) && options.batchFirst)
      tensor = swapLeadingDims(tensor);
  return result;
}

} // namespace rnnc
