#include "passes/Premultiply.h"

#include "ir/Builder.h"
#include "passes/DeadCodeElimination.h"
#include "passes/Dependence.h"
#include "passes/SinkSlices.h"

#include <algorithm>

namespace rnnc::passes {
namespace {

using ir::Op;

bool isAdd(const ir::Value* v) {
  return !v->isArgument() && v->def->op == Op::Add;
}

// Step 1 for the add tree rooted at block[rootIndex]: its leaves are found by descending into
// single-use adds of the root's own dependence. When two or more leaves depend on less than the
// root, they are summed first (parameter-only ones before the rest) and the root is rebuilt as
// `same-dependence terms + that sum`. Returns whether it rewrote; the old adds are left dead.
using UseCounts = ir::ValueMap<int>;

int usesOf(const UseCounts& uses, const ir::Value* v) {
  const int* count = uses.find(v);
  return count ? *count : 0;
}

// Whether the add `v` is inside a larger tree: its one use is an add of its own dependence, so
// the tree's root finds it (and a rewrite from it alone could find nothing the root's misses).
bool innerAdd(const ir::Instr& v, const UseCounts& uses,
              const ir::ValueMap<const ir::Instr*>& users, DependenceMap& dependence) {
  if (v.op != Op::Add || usesOf(uses, &v.result) != 1)
    return false;
  const ir::Instr* const* user = users.find(&v.result);
  return user && (*user)->op == Op::Add && dependence(&(*user)->result) == dependence(&v.result);
}

bool reassociate(ir::Cell& cell, ir::Block& block, size_t rootIndex, DependenceMap& dependence,
                 const UseCounts& uses) {
  ir::Instr& root = *block[rootIndex];
  Dependence rootDep = dependence(&root.result);
  if (root.op != Op::Add || rootDep == Dependence::ParamsOnly)
    return false;
  std::vector<ir::Value*> params, inputs, same;
  std::vector<ir::Value*> stack = {root.operands[1], root.operands[0]};
  while (!stack.empty()) {
    ir::Value* v = stack.back();
    stack.pop_back();
    if (isAdd(v) && dependence(v) == rootDep && usesOf(uses, v) == 1) {
      stack.push_back(v->def->operands[1]);
      stack.push_back(v->def->operands[0]);
    } else if (dependence(v) == rootDep) {
      same.push_back(v);
    } else {
      (dependence(v) == Dependence::ParamsOnly ? params : inputs).push_back(v);
    }
  }
  if (params.size() + inputs.size() < 2)
    return false;

  ir::Builder builder(cell, block);
  size_t at = rootIndex;
  auto sum = [&](const std::vector<ir::Value*>& terms) {
    ir::Value* total = terms[0];
    for (size_t i = 1; i < terms.size(); ++i) {
      total = builder.insert(at++, Op::Add, {total, terms[i]});
      dependence.update(*total->def);
    }
    return total;
  };
  std::vector<ir::Value*> lower = inputs;
  if (!params.empty())
    lower.push_back(sum(params));
  std::vector<ir::Value*> terms = same;
  terms.push_back(sum(lower));
  ir::Value* replacement = sum(terms);
  ir::replaceAllUses(cell, &block[at]->result, replacement);
  return true;
}

// The only instruction that reads `value`, or null.
const ir::Instr* soleUser(const ir::Cell& cell, const ir::Value* value) {
  if (ir::countUses(cell, value) != 1)
    return nullptr;
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block)
      for (const ir::Value* operand : instr->operands)
        if (operand == value)
          return instr.get();
  return nullptr; // the use is an update or the output
}

// A gate's sum that reads the recurrent product through a slice of the biased product (a GRU's
// chunk(linear(h, W_hh, b_hh)): r = sigmoid(xr + hr)) hides the bias from reassociate(). Such
// a slice is sunk (slice(a + b) -> slice(a) + slice(b)) when it feeds a sum and the sliced sum
// has a term of lower dependence than itself. Other slices are left to the sink-slices pass:
// sinking an LSTM's four gate slices here would split its one input-side sum in four. Returns
// whether it sank any.
bool exposeBiases(ir::Cell& cell, ir::Block& block) {
  DependenceMap dependence(cell);
  bool changed = false;
  for (size_t i = 0; i < block.size(); ++i) {
    const ir::Instr& slice = *block[i];
    if (slice.op != Op::Slice || slice.operands[0]->isArgument() ||
        slice.operands[0]->def->op != Op::Add)
      continue;
    const ir::Instr* user = soleUser(cell, &slice.result);
    if (!user || user->op != Op::Add)
      continue;
    const ir::Instr& sum = *slice.operands[0]->def;
    bool lowerTerm = std::any_of(sum.operands.begin(), sum.operands.end(), [&](const ir::Value* v) {
      return dependence(v) < dependence(&sum.result);
    });
    if (lowerTerm && sinkSlice(cell, block, i)) {
      eliminateDeadCode(cell);
      dependence = DependenceMap(cell); // of the new instructions too
      i = static_cast<size_t>(-1);      // indices moved: start over
      changed = true;
    }
  }
  return changed;
}

// reassociate() on every tree of `block` until none changes; whether any did.
bool reassociateAll(ir::Cell& cell, ir::Block& block) {
  DependenceMap dependence(cell);
  bool changed = false;
  // Each rewrite leaves at most one lower-dependence term per tree, so this terminates. Only
  // trees' roots are tried: each rewrite is then linear in the cell, and there is at most one
  // per tree.
  bool rewrote = true;
  while (rewrote) {
    rewrote = false;
    const UseCounts uses = ir::useCounts(cell);
    ir::ValueMap<const ir::Instr*> users(block.size()); // of single-use values
    for (const auto& instr : block)
      for (const ir::Value* operand : instr->operands)
        users[operand] = instr.get();
    for (size_t i = 0; i < block.size() && !rewrote; ++i)
      if (!innerAdd(*block[i], uses, users, dependence) &&
          reassociate(cell, block, i, dependence, uses)) {
        eliminateDeadCode(cell); // keeps use counts exact for the next tree
        rewrote = changed = true;
      }
  }
  return changed;
}

// Which step instructions leave the loop. Not everything the state does not reach: a row-wise
// op costs the same work in either block, but in `pre` its result is an array over all T*B rows,
// written once and read back from memory by the loop, where in the loop it is computed in
// registers from what the step reads anyway (a backward step's gate derivatives, computed
// from the kept gates, were six such arrays). So what leaves is what gains from it: the matrix
// products (one GEMM over T*B rows) with everything they read, parameter-only values (computed
// once instead of per step), and ops that read nothing but those (a product's bias, slices, an
// input-side layer norm: the GEMM's epilogue, no new array).
std::vector<bool> worthHoisting(const ir::Cell& cell) {
  DependenceMap dependence(cell);
  const ir::Block& step = cell.step;
  ir::ValueMap<size_t> indexOf(step.size());
  for (size_t i = 0; i < step.size(); ++i)
    indexOf[&step[i]->result] = i;
  auto invariant = [&](size_t i) { return dependence(&step[i]->result) != Dependence::State; };
  std::vector<bool> hoist(step.size(), false);
  for (size_t i = 0; i < step.size(); ++i)
    hoist[i] = invariant(i) && (ir::isMatrixProduct(step[i]->op) ||
                                dependence(&step[i]->result) == Dependence::ParamsOnly);
  // What a hoisted instruction reads goes with it (operands come earlier: walk backwards).
  for (size_t i = step.size(); i-- > 0;)
    if (hoist[i])
      for (const ir::Value* operand : step[i]->operands)
        if (const size_t* index = indexOf.find(operand))
          hoist[*index] = true;
  // Ops on hoisted values, `pre` values and parameters only.
  ir::ValueSet preValues(cell.pre.size());
  for (const auto& instr : cell.pre)
    preValues.insert(&instr->result);
  auto inPre = [&](const ir::Value* v) {
    if (const size_t* index = indexOf.find(v))
      return static_cast<bool>(hoist[*index]);
    return preValues.contains(v) || dependence(v) == Dependence::ParamsOnly;
  };
  for (size_t i = 0; i < step.size(); ++i)
    if (!hoist[i] && invariant(i))
      hoist[i] = std::all_of(step[i]->operands.begin(), step[i]->operands.end(), inPre);
  return hoist;
}

} // namespace

bool premultiply(ir::Cell& cell) {
  // Whether anything changed, from what each part did (printing the cell before and after to
  // compare took a tenth of the whole pipeline's time).
  bool changed = exposeBiases(cell, cell.step);
  changed |= reassociateAll(cell, cell.step);
  const std::vector<bool> hoist = worthHoisting(cell);
  changed |= std::find(hoist.begin(), hoist.end(), true) != hoist.end();
  // Move in program order, so every hoisted instruction's operands stay defined before it.
  ir::Block kept;
  for (size_t i = 0; i < cell.step.size(); ++i)
    (hoist[i] ? cell.pre : kept).push_back(std::move(cell.step[i]));
  cell.step = std::move(kept);
  // Sums that came out of the loop with their biases: the parameter terms of each are added
  // first, into one vector computed once (a GRU's b_ir + b_hr).
  changed |= exposeBiases(cell, cell.pre);
  changed |= reassociateAll(cell, cell.pre);
  return changed;
}

} // namespace rnnc::passes
