#include "passes/Autodiff.h"

#include "ir/Builder.h"
#include "ir/Error.h"
#include "ir/Verifier.h"
#include "passes/DeadCodeElimination.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace rnnc::passes {
namespace {

using ir::Dim;
using ir::Op;
using ir::Value;

Dim widthOf(const Value* v) {
  return v->shape.empty() ? Dim::constant(1) : v->shape.back();
}

// The gradient of a value read through slices: the parts, each at its offset.
struct SlicePart {
  Dim offset, width;
  Value* gradient;
};

class Differentiator {
public:
  Differentiator(const ir::Cell& forward, ForwardValues policy, BackwardCell& out)
      : forward_(forward), policy_(policy), out_(out), b_(*out.cell, out.cell->step) {}

  void run() {
    declareArguments();
    recomputeForward();
    seedGradients();
    for (auto it = recomputed_.rbegin(); it != recomputed_.rend(); ++it)
      differentiate(**it);
    finish();
    if (policy_ == ForwardValues::Keep)
      readKeptValues();
    else
      keepMasks();
    ir::verify(cell());
  }

private:
  ir::Cell& cell() { return *out_.cell; }

  void declareArguments() {
    ir::Cell& c = cell();
    c.name = forward_.name + "_backward";
    c.sizeNames = forward_.sizeNames;
    c.sizes = forward_.sizes;
    auto checkName = [&](const std::string& name) {
      for (const char* prefix : {kGradPrefix, kKeptPrefix, kDerivedPrefix})
        if (name.rfind(prefix, 0) == 0)
          throw UserError(fmt::format("cell '{}': the argument name '{}' is reserved for "
                                      "training (names starting with '{}')",
                                      forward_.name, name, prefix));
    };
    for (const auto& x : forward_.inputs) {
      checkName(x->name);
      map_[x.get()] = c.addArgument(ir::ArgKind::Input, x->name, x->shape);
      forwardInputs_.insert(map_[x.get()]);
    }
    for (const auto& s : forward_.states) {
      checkName(s->name);
      map_[s.get()] = c.addArgument(ir::ArgKind::Input, s->name, s->shape);
    }
    gradOutput_ = c.addArgument(ir::ArgKind::Input, std::string(kGradPrefix) + "output",
                                forward_.output->shape);
    for (const auto& s : forward_.states)
      gradStates_.push_back(
          c.addArgument(ir::ArgKind::State, std::string(kGradPrefix) + s->name, s->shape));
    for (const auto& p : forward_.params)
      map_[p.get()] = c.addArgument(ir::ArgKind::Param, p->name, p->shape);
  }

  // The forward step again (its pre block first: every op is row-wise, so a hoisted value is
  // the same per step), each value's twin in map_.
  void recomputeForward() {
    for (const ir::Block* block : {&forward_.pre, &forward_.step})
      for (const auto& instr : *block) {
        std::vector<Value*> operands;
        for (const Value* operand : instr->operands)
          operands.push_back(map_.at(operand));
        Value* result = instr->op == Op::Slice
                            ? b_.slice(operands[0], instr->attrs.offset, widthOf(&instr->result))
                            : b_.create(instr->op, operands, instr->attrs);
        map_[&instr->result] = result;
        recomputed_.push_back(result->def);
      }
  }

  void seedGradients() {
    accumulate(map_.at(forward_.output), gradOutput_);
    for (size_t i = 0; i < forward_.updates.size(); ++i)
      accumulate(map_.at(forward_.updates[i].next), gradStates_[i]);
  }

  // --- building blocks ---
  Value* constant(double v) { return b_.constant(v); }
  Value* add(Value* a, Value* c) { return b_.create(Op::Add, {a, c}); }
  Value* sub(Value* a, Value* c) { return b_.create(Op::Sub, {a, c}); }
  Value* mul(Value* a, Value* c) { return b_.create(Op::Mul, {a, c}); }
  Value* div(Value* a, Value* c) { return b_.create(Op::Div, {a, c}); }
  Value* step(Value* a) { return b_.create(Op::Step, {a}); }

  static bool isConstant(const Value* v) { return !v->isArgument() && v->def->op == Op::Const; }

  void accumulate(Value* v, Value* gradient) {
    if (isConstant(v))
      return;
    auto [it, fresh] = gradients_.emplace(v, gradient);
    if (!fresh)
      it->second = add(it->second, gradient);
  }

  // dLoss/dv: the direct contributions plus the parts its slices received, zeros where no
  // slice reads; null when nothing depends on v.
  Value* gradientOf(Value* v) {
    Value* whole = nullptr;
    if (auto it = gradients_.find(v); it != gradients_.end())
      whole = it->second;
    auto parts = sliceParts_.find(v);
    if (parts == sliceParts_.end())
      return whole;
    std::vector<SlicePart>& list = parts->second;
    // Parts of the same slice (CSE may not have run) add up first.
    std::vector<SlicePart> merged;
    for (const SlicePart& part : list) {
      auto same = std::find_if(merged.begin(), merged.end(), [&](const SlicePart& m) {
        return m.offset == part.offset && m.width == part.width;
      });
      if (same != merged.end())
        same->gradient = add(same->gradient, part.gradient);
      else
        merged.push_back(part);
    }
    std::sort(merged.begin(), merged.end(), [](const SlicePart& a, const SlicePart& c) {
      return (c.offset - a.offset).isProvablyPositive();
    });
    std::vector<Value*> pieces;
    Dim cursor;
    auto zeros = [&](Dim offset, Dim width) {
      if (!v->isBatched())
        throw UserError(fmt::format("autodiff: cell '{}' reads parts of a value without the "
                                    "batch dimension ({}) through slices that leave gaps",
                                    forward_.name, ir::shapeStr(v->shape)));
      return mul(b_.slice(v, offset, width), constant(0));
    };
    for (const SlicePart& part : merged) {
      Dim gap = part.offset - cursor;
      if (gap.isProvablyPositive())
        pieces.push_back(zeros(cursor, gap));
      else if (gap != Dim())
        throw UserError(fmt::format("autodiff: cell '{}' reads overlapping slices of one value "
                                    "([{} : {}] and one ending at {})",
                                    forward_.name, part.offset.str(),
                                    (part.offset + part.width).str(), cursor.str()));
      pieces.push_back(part.gradient);
      cursor = part.offset + part.width;
    }
    Dim tail = widthOf(v) - cursor;
    if (tail.isProvablyPositive())
      pieces.push_back(zeros(cursor, tail));
    Value* sliced = pieces.size() == 1 ? pieces[0] : b_.create(Op::Concat, pieces);
    return whole ? add(whole, sliced) : sliced;
  }

  [[noreturn]] void unsupported(const ir::Instr& instr, const std::string& why) {
    throw UserError(fmt::format("autodiff: cell '{}': cannot differentiate '{}': {}", forward_.name,
                                ir::opName(instr.op), why));
  }

  // The name the segments give a product's weight: a parameter's own, or, for a matrix made of
  // parameters alone through operations the runner differentiates, kDerivedPrefix and its
  // number (one per value, however many products read it).
  std::string weightName(const ir::Instr& product, const Value* w) {
    if (param(const_cast<Value*>(w)))
      return w->name;
    if (w->isBatched() || !madeOfParameters(w, product))
      unsupported(product, "its weight is neither a parameter nor made of parameters alone");
    const auto at = std::find(recomputed_.begin(), recomputed_.end(), w->def);
    RNNC_INTERNAL_CHECK(at != recomputed_.end(), "a weight the forward does not make");
    const size_t position = static_cast<size_t>(at - recomputed_.begin());
    for (const DerivedWeight& derived : out_.derivedWeights)
      if (derived.position == position)
        return derived.name;
    out_.derivedWeights.push_back(
        {fmt::format("{}{}", kDerivedPrefix, out_.derivedWeights.size()), position});
    return out_.derivedWeights.back().name;
  }

  // Whether v is computed from parameters and constants alone, through operations the runner
  // differentiates on whole matrices; a UserError naming the first that it does not.
  bool madeOfParameters(const Value* v, const ir::Instr& product) {
    if (v->isArgument())
      return v->argKind == ir::ArgKind::Param;
    if (!differentiableInWeights(v->def->op))
      unsupported(product, fmt::format("its weight is made of parameters through '{}', which "
                                       "training does not differentiate",
                                       ir::opName(v->def->op)));
    return std::all_of(v->def->operands.begin(), v->def->operands.end(),
                       [&](const Value* operand) { return madeOfParameters(operand, product); });
  }

  Value* param(Value* v) const {
    return v->isArgument() && v->argKind == ir::ArgKind::Param ? v : nullptr;
  }

  // --- the rules: add each operand's share of g = dLoss/d(result) ---
  void differentiate(ir::Instr& instr) {
    Value* r = &instr.result;
    Value* g = gradientOf(r);
    if (!g)
      return; // nothing downstream depends on it
    const std::vector<Value*> x = instr.operands;
    switch (instr.op) {
    case Op::Const:
      return;
    case Op::Slice:
      sliceParts_[x[0]].push_back({instr.attrs.offset, widthOf(r), g});
      return;
    case Op::Concat: {
      Dim offset;
      for (Value* part : x) {
        accumulate(part, b_.slice(g, offset, widthOf(part)));
        offset = offset + widthOf(part);
      }
      return;
    }
    case Op::Linear:
    case Op::MatMul: {
      const std::string weight = weightName(instr, x[1]);
      if (!x[0]->isBatched())
        unsupported(instr, "its operand has no batch dimension");
      // da = g W (linear: W is [N, K]) or g W^T (matmul: W is [K, N]). For an input of the
      // forward the runner does it, one product over every step after the loop: in the loop
      // it would cost a per-step product, and nothing in the loop reads it.
      if (forwardInputs_.count(x[0]))
        inputFactors_.push_back({instr.op, weight, x[0], g});
      else
        accumulate(x[0], b_.create(instr.op == Op::Linear ? Op::MatMul : Op::Linear, {g, x[1]}));
      weightFactors_.push_back({instr.op, weight, x[0], g});
      return;
    }
    case Op::Add:
      accumulate(x[0], g);
      accumulate(x[1], g);
      return;
    case Op::Sub:
      accumulate(x[0], g);
      accumulate(x[1], b_.create(Op::Neg, {g}));
      return;
    case Op::Mul:
      accumulate(x[0], mul(g, x[1]));
      accumulate(x[1], mul(g, x[0]));
      return;
    case Op::Div: // d(a/b) = da/b - r db/b
      accumulate(x[0], div(g, x[1]));
      accumulate(x[1], b_.create(Op::Neg, {div(mul(g, r), x[1])}));
      return;
    case Op::Min:
    case Op::Max: {
      // As torch.minimum/maximum: the winner takes g, a tie splits it evenly.
      Value* winsA = instr.op == Op::Min ? sub(x[1], x[0]) : sub(x[0], x[1]);
      Value* winsB = b_.create(Op::Neg, {winsA});
      Value* shareA = mul(constant(0.5), add(constant(1), sub(step(winsA), step(winsB))));
      accumulate(x[0], mul(g, shareA));
      accumulate(x[1], mul(g, sub(constant(1), shareA)));
      return;
    }
    case Op::Neg:
      accumulate(x[0], b_.create(Op::Neg, {g}));
      return;
    case Op::Sigmoid:
      accumulate(x[0], mul(g, mul(r, sub(constant(1), r))));
      return;
    case Op::Tanh:
      accumulate(x[0], mul(g, sub(constant(1), mul(r, r))));
      return;
    case Op::Relu: // as torch: g where the result is positive
      accumulate(x[0], mul(g, step(r)));
      return;
    case Op::Exp:
      accumulate(x[0], mul(g, r));
      return;
    case Op::Log:
      accumulate(x[0], div(g, x[0]));
      return;
    case Op::Sqrt:
      accumulate(x[0], div(mul(g, constant(0.5)), r));
      return;
    case Op::Clamp: { // as torch: g where lo <= x <= hi
      Value* below = step(sub(constant(instr.attrs.lo), x[0]));
      Value* above = step(sub(x[0], constant(instr.attrs.hi)));
      accumulate(x[0], mul(g, mul(sub(constant(1), below), sub(constant(1), above))));
      return;
    }
    case Op::Dropout: // inference: the identity (training makes its masks explicit first)
      accumulate(x[0], g);
      return;
    case Op::DropoutMask: // reads only its operand's shape
      return;
    case Op::LayerNorm: {
      ir::Attrs attrs;
      attrs.value = instr.attrs.value;
      // A norm of a value without the batch dimension (of parameters alone) is read by every
      // row, each with its own gradient: the rows' gradients through the norm of the same
      // operand, which layernorm_grad takes as wide as they are.
      Value* operand = x[0];
      if (!operand->isBatched() && g->isBatched())
        operand = add(operand, mul(g, constant(0)));
      accumulate(x[0], b_.create(Op::LayerNormGrad, {operand, g}, attrs));
      return;
    }
    case Op::Stack:
      unsupported(instr, "stacked weights are made by passes, after differentiation");
    case Op::Step:
    case Op::LayerNormGrad:
      unsupported(instr, "it is made by differentiation, which runs once");
    }
    unsupported(instr, "no rule");
  }

  // The states' gradients for the step before, and the output: every per-step gradient side
  // by side.
  void finish() {
    ir::Cell& c = cell();
    auto orZeros = [&](Value* gradient, Value* like) {
      return gradient ? gradient : mul(like, constant(0));
    };
    for (size_t i = 0; i < forward_.states.size(); ++i) {
      Value* state = map_.at(forward_.states[i].get());
      c.updates.push_back({gradStates_[i], orZeros(gradientOf(state), state)});
    }
    std::vector<Value*> columns;
    std::map<Value*, Dim> placed;
    Dim offset;
    auto place = [&](Value* v) {
      auto [it, fresh] = placed.emplace(v, offset);
      if (fresh) {
        columns.push_back(v);
        offset = offset + widthOf(v);
      }
      return it->second;
    };
    for (const auto& input : forward_.inputs) {
      Value* x = map_.at(input.get());
      if (Value* gradient = gradientOf(x)) // what elementwise reads of x contribute
        out_.segments.push_back(
            {GradientSegment::Kind::Input, input->name, place(gradient), widthOf(x)});
    }
    for (const WeightFactor& f : inputFactors_) {
      GradientSegment segment{f.op == Op::Linear ? GradientSegment::Kind::InputByLinear
                                                 : GradientSegment::Kind::InputByMatMul,
                              f.operand->name, place(f.gradient), widthOf(f.gradient)};
      segment.weight = f.weight;
      segment.operandWidth = widthOf(f.operand);
      out_.segments.push_back(segment);
    }
    for (const WeightFactor& f : weightFactors_) {
      GradientSegment segment{f.op == Op::Linear ? GradientSegment::Kind::LinearWeight
                                                 : GradientSegment::Kind::MatMulWeight,
                              f.weight, place(f.gradient), widthOf(f.gradient)};
      if (f.operand->isArgument())
        segment.operandInput = f.operand->name;
      else
        segment.operandOffset = place(f.operand);
      segment.operandWidth = widthOf(f.operand);
      out_.segments.push_back(segment);
    }
    for (const auto& p : forward_.params) {
      Value* w = map_.at(p.get());
      if (w->shape.size() != 1)
        continue; // matrices: products only, handled above
      Value* gradient = gradientOf(w);
      if (!gradient)
        continue;
      if (!gradient->isBatched()) // a parameter-only path: one contribution per row all the same
        unsupported(*gradient->def, "a parameter's gradient without the batch dimension");
      Dim at = place(gradient);
      out_.segments.push_back({GradientSegment::Kind::VectorWeight, p->name, at, widthOf(w)});
    }
    // A cell none of whose inputs or vector parameters reach the loss (whatever reads them is
    // dead) still has a per-step output: zeros the width of its first state's gradient, which
    // no segment reads.
    if (columns.empty()) {
      RNNC_INTERNAL_CHECK(!gradStates_.empty(), "a cell without states");
      columns.push_back(mul(gradStates_[0], constant(0)));
    }
    c.output = columns.size() == 1 ? columns[0] : b_.create(Op::Concat, columns);
  }

  // Which forward values the training forward keeps, so that the backward step runs none of
  // the forward's products again (for an LSTM they are half the step's work: x W_ih and
  // h W_hh). Walking the forward in order, a value the gradients read is kept when it depends
  // on a product through values not kept already; the rest is recomputed, elementwise from
  // kept values, inputs and states. An LSTM keeps its four activated gates (c' and tanh(c')
  // are recomputed from them and c), a GRU r, z, n and h W_hn + b_hn, a tanh RNN h'. Each kept
  // value becomes an input `kept.<k>` of the backward cell, and what only computed it is dead.
  void readKeptValues() {
    ir::Cell& c = cell();
    std::set<const Value*> recomputed;
    for (const ir::Instr* instr : recomputed_)
      recomputed.insert(&instr->result);
    std::set<const Value*> read; // recomputed values the gradients read
    for (const auto& instr : c.step)
      if (!recomputed.count(&instr->result))
        for (const Value* operand : instr->operands)
          if (recomputed.count(operand))
            read.insert(operand);
    for (const ir::StateUpdate& update : c.updates)
      if (recomputed.count(update.next))
        read.insert(update.next);
    if (recomputed.count(c.output))
      read.insert(c.output);

    // A dropout's mask counts as a product: drawn again in the backward step, it would be drawn
    // for other rows (the backward runs its own steps), so the forward's is kept, and so is
    // whatever the gradients read that depends on it.
    std::set<const Value*> reachesProduct; // through values not kept
    for (size_t position = 0; position < recomputed_.size(); ++position) {
      ir::Instr& instr = *recomputed_[position];
      bool product =
          instr.op == Op::Linear || instr.op == Op::MatMul || instr.op == Op::DropoutMask;
      for (const Value* operand : instr.operands)
        product = product || reachesProduct.count(operand);
      if (!product)
        continue;
      if (!read.count(&instr.result)) {
        reachesProduct.insert(&instr.result);
        continue;
      }
      keep(instr, position);
    }
    eliminateDeadCode(c);
  }

  // Recompute: the forward step runs again inside the backward one, but for the masks of its
  // dropouts, which the forward keeps (see readKeptValues).
  void keepMasks() {
    ir::Cell& c = cell();
    std::set<const Value*> used{c.output};
    for (const auto& instr : c.step)
      used.insert(instr->operands.begin(), instr->operands.end());
    for (const ir::StateUpdate& update : c.updates)
      used.insert(update.next);
    for (size_t position = 0; position < recomputed_.size(); ++position)
      if (recomputed_[position]->op == Op::DropoutMask &&
          used.count(&recomputed_[position]->result))
        keep(*recomputed_[position], position);
    eliminateDeadCode(c);
  }

  // The forward value at `position` (`instr`'s twin here) becomes the input `kept.<k>`.
  void keep(ir::Instr& instr, size_t position) {
    ir::Cell& c = cell();
    RNNC_INTERNAL_CHECK(instr.result.isBatched(), "a kept value without the batch dimension");
    Value* kept = c.addArgument(
        ir::ArgKind::Input, fmt::format("{}{}", kKeptPrefix, out_.kept.size()), instr.result.shape);
    ir::replaceAllUses(c, &instr.result, kept);
    out_.kept.push_back(position);
  }

  struct WeightFactor {
    Op op;
    std::string weight; // a parameter's name, or a derived weight's (kDerivedPrefix)
    Value* operand;
    Value* gradient;
  };

  const ir::Cell& forward_;
  const ForwardValues policy_;
  BackwardCell& out_;
  ir::Builder b_;
  std::map<const Value*, Value*> map_; // forward value -> its twin in the backward cell
  std::vector<ir::Instr*> recomputed_;
  Value* gradOutput_ = nullptr;
  std::vector<Value*> gradStates_;
  std::map<Value*, Value*> gradients_;
  std::map<Value*, std::vector<SlicePart>> sliceParts_;
  std::vector<WeightFactor> weightFactors_;
  std::vector<WeightFactor> inputFactors_; // products of forward inputs: dx = g W by the runner
  std::set<Value*> forwardInputs_;
};

} // namespace

TrainingForward trainingForward(const ir::Cell& forward, const BackwardCell& backward) {
  TrainingForward out;
  out.cell = forward.clone();
  ir::Cell& cell = *out.cell;
  cell.name = forward.name + "_training";
  std::vector<ir::Instr*> instrs; // in the order deriveBackward counts positions
  for (ir::Block* block : {&cell.pre, &cell.step})
    for (auto& instr : *block)
      instrs.push_back(instr.get());
  // Each distinct value once, at the columns it was first placed at.
  std::vector<Value*> columns;
  std::map<const Value*, Dim> offsets;
  Dim width = Dim::constant(0);
  auto place = [&](Value* v) {
    auto [it, fresh] = offsets.emplace(v, width);
    if (fresh) {
      columns.push_back(v);
      width = width + widthOf(v);
    }
    return it->second;
  };
  place(cell.output);
  for (const auto& state : cell.states) {
    const ir::StateUpdate* update = cell.updateOf(state.get());
    out.stateOffsets.push_back(place(update ? update->next : state.get()));
  }
  for (size_t position : backward.kept) {
    RNNC_INTERNAL_CHECK(position < instrs.size(), "a kept value the forward does not have");
    out.keptOffsets.push_back(place(&instrs[position]->result));
  }
  if (columns.size() > 1)
    cell.output = ir::Builder(cell, cell.step).create(Op::Concat, columns);
  out.width = width;
  ir::verify(cell);
  return out;
}

bool differentiableInWeights(ir::Op op) {
  // The elementwise ops (a dropout is the identity in inference; training gives it a mask
  // parameter first) but `step`, which only differentiation makes; column slices and concats.
  return (ir::isElementwise(op) && op != Op::Step) || op == Op::Slice || op == Op::Concat;
}

BackwardCell deriveBackward(const ir::Cell& forward, ForwardValues policy) {
  BackwardCell out;
  out.cell = std::make_unique<ir::Cell>();
  Differentiator(forward, policy, out).run();
  return out;
}

} // namespace rnnc::passes
