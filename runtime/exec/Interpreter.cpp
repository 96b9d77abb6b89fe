#include "runtime/exec/Interpreter.h"

#include "ir/Error.h"
#include "runtime/exec/Hash.h"
#include "runtime/exec/Int8Reference.h"

#include <Eigen/Core>

#include <cmath>
#include <deque>
#include <unordered_map>

namespace rnnc {

ExecutionOptions withProductsAs(codegen::WeightType weights, ExecutionOptions options) {
  options.bf16Products = weights == codegen::WeightType::BF16;
  options.f16Weights = weights == codegen::WeightType::F16;
  options.int8Products = weights == codegen::WeightType::I8;
  return options;
}

void checkReducedWeightsChangeSomething(const ir::Cell& cell, codegen::WeightType weights) {
  if (weights == codegen::WeightType::F32)
    return;
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block)
      if (ir::isMatrixProduct(instr->op) && !instr->operands[1]->isBatched())
        return;
  throw UserError("cell '" + cell.name + "' has no linear or matmul with parameter weights: " +
                  std::string(codegen::weightTypeName(weights)) + " weights would change nothing");
}

namespace {

using ir::Op;
using RowMajor = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajor>;
using MatrixR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Views a rank-0/1/2 tensor as a matrix: [] -> 1x1, [F] -> 1xF, [M, F] -> MxF.
int64_t rowsOf(const Tensor& t) {
  return t.rank() == 2 ? t.dim(0) : 1;
}
int64_t colsOf(const Tensor& t) {
  return t.rank() == 0 ? 1 : t.shape().back();
}
ConstMatrixMap view(const Tensor& t) {
  return ConstMatrixMap(t.data(), rowsOf(t), colsOf(t));
}
MatrixMap view(Tensor& t) {
  return MatrixMap(t.data(), rowsOf(t), colsOf(t));
}

// Calls f with `t` as an R x C Eigen expression, broadcasting a scalar or a row vector.
template <class F> void broadcastTo(const Tensor& t, int64_t rows, int64_t cols, F&& f) {
  if (t.numel() == 1 && rows * cols != 1)
    f(RowMajor::Constant(rows, cols, t.data()[0]));
  else if (rowsOf(t) == 1 && rows != 1)
    f(view(t).replicate(rows, 1));
  else
    f(view(t));
}

template <class F> void binary(const Tensor& a, const Tensor& b, Tensor& out, F&& f) {
  MatrixMap y = view(out);
  broadcastTo(a, y.rows(), y.cols(), [&](auto&& A) {
    broadcastTo(b, y.rows(), y.cols(), [&](auto&& B) { y = f(A, B); });
  });
}

// NaN-propagating minimum and maximum, as torch.minimum/maximum, relu and clamp behave.
float nanMin(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
}
float nanMax(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
}

// Everything one instruction needs to run besides its operands.
struct EvalContext {
  const ExecutionOptions& options;
  int64_t firstRow; // the sequence-wide index (t*B + b) of this batch's first row
  int dropoutIndex; // which of the cell's dropouts and masks this is (pre block, then step)
};

// The mask of dropout `stream` over x's rows (1 / (1 - p) kept, 0 dropped): runtime/exec/Hash.h.
void dropoutMask(const Tensor& x, Tensor& out, double p, uint64_t stream, const EvalContext& ctx) {
  const int64_t cols = colsOf(x);
  for (int64_t r = 0; r < rowsOf(x); ++r)
    fillDropoutMaskRow(ctx.options.seed, stream, static_cast<uint64_t>(ctx.firstRow + r), p,
                       out.data() + r * cols, cols);
}

// In training, x times the mask of stream k for the cell's k-th dropout: the stream
// passes/TrainingDropout.h gives it as a dropout_mask, which replaces each dropout one for one
// (so a dropout it leaves, of a value without the batch dimension, keeps its number too); else x.
void dropout(const Tensor& x, Tensor& out, double p, const EvalContext& ctx) {
  if (!ctx.options.training || p == 0) {
    out = x;
    return;
  }
  dropoutMask(x, out, p, static_cast<uint64_t>(ctx.dropoutIndex), ctx);
  for (int64_t i = 0; i < x.numel(); ++i)
    out.data()[i] *= x.data()[i];
}

void layerNorm(const Tensor& x, Tensor& out, double eps) {
  ConstMatrixMap in = view(x);
  MatrixMap y = view(out);
  for (Eigen::Index r = 0; r < in.rows(); ++r) {
    float mean = in.row(r).mean();
    auto centered = in.row(r) - mean;
    float variance = centered.square().mean(); // biased, as torch.nn.LayerNorm
    y.row(r) = centered / std::sqrt(variance + static_cast<float>(eps));
  }
}

// dx = (g - mean(g) - y * mean(g * y)) / sqrt(var + eps), y = layernorm(x): the rows' means and
// spreads recomputed from x.
void layerNormGrad(const Tensor& x, const Tensor& g, Tensor& out, double eps) {
  ConstMatrixMap in = view(x), grad = view(g);
  MatrixMap dx = view(out);
  for (Eigen::Index r = 0; r < in.rows(); ++r) {
    float mean = in.row(r).mean();
    Eigen::ArrayXf centered = (in.row(r).array() - mean).transpose();
    float inverseSpread = 1.0f / std::sqrt(centered.square().mean() + static_cast<float>(eps));
    Eigen::ArrayXf y = centered * inverseSpread;
    Eigen::ArrayXf gr = grad.row(r).array().transpose();
    dx.row(r) = ((gr - gr.mean() - y * (gr * y).mean()) * inverseSpread).transpose();
  }
}

void evaluate(const ir::Instr& instr, const std::vector<const Tensor*>& in, Tensor& out,
              const EvalContext& ctx) {
  const ir::Attrs& a = instr.attrs;
  auto unary = [&](auto&& f) { view(out) = f(view(*in[0])); };
  switch (instr.op) {
  case Op::Const:
    out.data()[0] = static_cast<float>(a.value);
    return;
  case Op::Slice: {
    int64_t offset = a.offset.constantValue();
    view(out) = view(*in[0]).middleCols(offset, colsOf(out));
    return;
  }
  case Op::Concat: {
    int64_t col = 0;
    for (const Tensor* part : in) {
      view(out).middleCols(col, colsOf(*part)) = view(*part);
      col += colsOf(*part);
    }
    return;
  }
  case Op::Stack: {
    float* to = out.data();
    for (const Tensor* part : in)
      to = std::copy(part->data(), part->data() + part->numel(), to);
    return;
  }
  case Op::Linear:
  case Op::MatMul: {
    if (ctx.options.int8Products) {
      int8ReferenceProduct(in[0]->data(), rowsOf(*in[0]), colsOf(*in[0]), in[1]->data(),
                           colsOf(out), instr.op == Op::Linear, out.data());
      return;
    }
    Eigen::Map<const MatrixR> given(in[0]->data(), rowsOf(*in[0]), colsOf(*in[0]));
    Eigen::Map<const MatrixR> givenWeights(in[1]->data(), in[1]->dim(0), in[1]->dim(1));
    MatrixR rounded, roundedWeights; // the operands rounded to bf16, or the weights to fp16
    const bool bf16 = ctx.options.bf16Products, f16 = ctx.options.f16Weights && !bf16;
    if (bf16) {
      auto toBf16 = [](float v) { return static_cast<float>(Eigen::bfloat16(v)); };
      rounded = given.unaryExpr(toBf16);
      roundedWeights = givenWeights.unaryExpr(toBf16);
    } else if (f16) {
      roundedWeights =
          givenWeights.unaryExpr([](float v) { return static_cast<float>(Eigen::half(v)); });
    }
    Eigen::Map<const MatrixR> x(bf16 ? rounded.data() : given.data(), given.rows(), given.cols());
    Eigen::Map<const MatrixR> w(bf16 || f16 ? roundedWeights.data() : givenWeights.data(),
                                givenWeights.rows(), givenWeights.cols());
    Eigen::Map<MatrixR> y(out.data(), rowsOf(out), colsOf(out));
    if (instr.op == Op::Linear)
      y.noalias() = x * w.transpose();
    else
      y.noalias() = x * w;
    return;
  }
  case Op::Add:
    return binary(*in[0], *in[1], out, [](auto&& x, auto&& y) { return x + y; });
  case Op::Sub:
    return binary(*in[0], *in[1], out, [](auto&& x, auto&& y) { return x - y; });
  case Op::Mul:
    return binary(*in[0], *in[1], out, [](auto&& x, auto&& y) { return x * y; });
  case Op::Div:
    return binary(*in[0], *in[1], out, [](auto&& x, auto&& y) { return x / y; });
  case Op::Min:
    return binary(*in[0], *in[1], out, [](auto&& x, auto&& y) {
      return x.binaryExpr(y, [](float p, float q) { return nanMin(p, q); });
    });
  case Op::Max:
    return binary(*in[0], *in[1], out, [](auto&& x, auto&& y) {
      return x.binaryExpr(y, [](float p, float q) { return nanMax(p, q); });
    });
  case Op::Neg:
    return unary([](auto&& x) { return -x; });
  case Op::Sigmoid:
    return unary([](auto&& x) { return 1.0f / (1.0f + (-x).exp()); });
  case Op::Tanh:
    return unary([](auto&& x) { return x.tanh(); });
  case Op::Relu:
    return unary([](auto&& x) { return x.unaryExpr([](float v) { return nanMax(v, 0.0f); }); });
  // exp, log and sqrt by libm, not Eigen's vector versions, which are off at the edges where the
  // generated code is right, and the reference must not be the one that is off: Eigen's exp
  // overflows to infinity from 88.38 on (exp is finite up to 88.72), its log takes subnormals
  // for zero (log(1e-40) = -87.3, not -92.1), and its sqrt(inf) is NaN (a cell fuzzed with
  // sqrt(t * t + 1) over a t that overflowed: NaN states from the reference, not the JIT).
  case Op::Exp:
    return unary([](auto&& x) { return x.unaryExpr([](float v) { return std::exp(v); }); });
  case Op::Log:
    return unary([](auto&& x) { return x.unaryExpr([](float v) { return std::log(v); }); });
  case Op::Sqrt:
    return unary([](auto&& x) { return x.unaryExpr([](float v) { return std::sqrt(v); }); });
  case Op::Clamp: {
    float lo = static_cast<float>(a.lo), hi = static_cast<float>(a.hi);
    return unary([&](auto&& x) {
      return x.unaryExpr([lo, hi](float v) { return nanMin(nanMax(v, lo), hi); });
    });
  }
  case Op::Dropout:
    // A dropout of parameters alone draws one mask for the run, its rows x's own: the mask a
    // layer's training run gives it as a parameter (passes::lowerParameterDropout).
    if (!instr.result.isBatched())
      return dropout(*in[0], out, a.value, EvalContext{ctx.options, 0, ctx.dropoutIndex});
    return dropout(*in[0], out, a.value, ctx);
  case Op::DropoutMask:
    return dropoutMask(*in[0], out, a.value, static_cast<uint64_t>(a.stream), ctx);
  case Op::LayerNorm:
    return layerNorm(*in[0], out, a.value);
  case Op::LayerNormGrad:
    return layerNormGrad(*in[0], *in[1], out, a.value);
  case Op::Step:
    return unary([](auto&& x) {
      return x.unaryExpr([](float v) { return std::isnan(v) ? v : v > 0 ? 1.0f : 0.0f; });
    });
  }
  RNNC_INTERNAL_CHECK(false, "interpreter has no rule for " + std::string(ir::opName(instr.op)));
}

TensorShape concreteShape(const ir::Shape& shape, const ir::SizeMap& sizes) {
  TensorShape out;
  for (const ir::Dim& d : shape) {
    auto value = d.evaluate(sizes);
    RNNC_INTERNAL_CHECK(value.has_value(), "unbound size in " + ir::shapeStr(shape));
    out.push_back(*value);
  }
  return out;
}

// Runs one block over `rows` rows. `env` maps values to their tensors; results are kept in
// `storage` (a deque, so pointers into it stay valid).
void runBlock(const ir::Block& block, const ir::Cell& cell, int64_t rows, int64_t firstRow,
              const ExecutionOptions& options,
              std::unordered_map<const ir::Value*, const Tensor*>& env, std::deque<Tensor>& storage,
              int firstDropout) {
  ir::SizeMap sizes = cell.sizes;
  sizes[ir::kBatchSymbol] = rows;
  int dropoutIndex = firstDropout;
  for (const auto& instr : block) {
    std::vector<const Tensor*> operands;
    for (const ir::Value* operand : instr->operands)
      operands.push_back(env.at(operand));
    Tensor& out = storage.emplace_back(concreteShape(instr->result.shape, sizes));
    evaluate(*instr, operands, out, EvalContext{options, firstRow, dropoutIndex});
    dropoutIndex += instr->op == Op::Dropout || instr->op == Op::DropoutMask;
    env[&instr->result] = &out;
  }
}

// Rows [step*batch, (step+1)*batch) of a sequence-wide [T*B, F] tensor, as [B, F].
Tensor stepRows(const Tensor& sequence, int64_t step, int64_t batch) {
  int64_t features = colsOf(sequence);
  const float* begin = sequence.data() + step * batch * features;
  return Tensor({batch, features}, std::vector<float>(begin, begin + batch * features));
}

} // namespace

Tensor evaluateUnbatched(const ir::Instr& instr, const std::vector<const Tensor*>& operands,
                         const ir::SizeMap& sizes) {
  RNNC_INTERNAL_CHECK(!instr.result.isBatched(), "evaluateUnbatched of a per-row value");
  const ExecutionOptions inference;
  Tensor out(concreteShape(instr.result.shape, sizes));
  evaluate(instr, operands, out, EvalContext{inference, 0, 0});
  return out;
}

Interpreter::Interpreter(const ir::Cell& cell, std::vector<Tensor> params, ExecutionOptions options)
    : cell_(cell), params_(std::move(params)), options_(options) {
  RNNC_INTERNAL_CHECK(params_.size() == cell_.params.size(), "wrong number of parameters");
  for (const auto& name : cell_.sizeNames)
    RNNC_INTERNAL_CHECK(cell_.sizes.count(name), "size '" + name + "' is not bound");
}

Tensor Interpreter::run(const std::vector<Tensor>& inputs, std::vector<Tensor>& states,
                        int64_t firstRow) const {
  RNNC_INTERNAL_CHECK(inputs.size() == cell_.inputs.size(), "wrong number of inputs");
  RNNC_INTERNAL_CHECK(states.size() == cell_.states.size(), "wrong number of states");
  const int64_t steps = inputs.empty() ? 0 : inputs[0].dim(0);
  const int64_t batch = states.empty() ? inputs.at(0).dim(1) : states[0].dim(0);

  std::unordered_map<const ir::Value*, const Tensor*> sequenceEnv;
  for (size_t i = 0; i < params_.size(); ++i)
    sequenceEnv[cell_.params[i].get()] = &params_[i];

  // The pre block runs once over all T*B rows: inputs are viewed as [T*B, F].
  std::deque<Tensor> preStorage;
  std::vector<Tensor> flatInputs;
  for (const Tensor& input : inputs)
    flatInputs.push_back(input.reshaped({steps * batch, input.dim(2)}));
  for (size_t i = 0; i < flatInputs.size(); ++i)
    sequenceEnv[cell_.inputs[i].get()] = &flatInputs[i];
  runBlock(cell_.pre, cell_, steps * batch, firstRow, options_, sequenceEnv, preStorage, 0);
  const int stepDropouts =
      static_cast<int>(std::count_if(cell_.pre.begin(), cell_.pre.end(), [](const auto& instr) {
        return instr->op == Op::Dropout || instr->op == Op::DropoutMask;
      }));

  // Per step: the step's rows of every input and pre result, then the step block.
  std::vector<Tensor> preSequences;
  std::vector<const ir::Value*> perStepValues;
  for (size_t i = 0; i < cell_.inputs.size(); ++i)
    perStepValues.push_back(cell_.inputs[i].get());
  // Pre results with a batch dimension are per-row ([T*B, F]) and read one step at a time;
  // parameter-only ones (say b_ih + b_hh, shape [F]) are read whole.
  for (const auto& instr : cell_.pre)
    if (instr->result.isBatched())
      perStepValues.push_back(&instr->result);

  ir::SizeMap stepSizes = cell_.sizes;
  stepSizes[ir::kBatchSymbol] = batch;
  TensorShape outStepShape = concreteShape(cell_.output->shape, stepSizes);
  Tensor output({steps, batch, outStepShape[1]});

  for (int64_t t = 0; t < steps; ++t) {
    std::unordered_map<const ir::Value*, const Tensor*> env = sequenceEnv;
    std::deque<Tensor> storage;
    for (const ir::Value* value : perStepValues)
      env[value] = &storage.emplace_back(stepRows(*sequenceEnv.at(value), t, batch));
    for (size_t i = 0; i < states.size(); ++i)
      env[cell_.states[i].get()] = &states[i];
    runBlock(cell_.step, cell_, batch, firstRow + t * batch, options_, env, storage, stepDropouts);

    const Tensor& out = *env.at(cell_.output);
    std::copy(out.data(), out.data() + out.numel(), output.data() + t * out.numel());
    std::vector<Tensor> next;
    for (const ir::StateUpdate& update : cell_.updates)
      next.push_back(*env.at(update.next));
    states = std::move(next);
  }
  return output;
}

} // namespace rnnc
