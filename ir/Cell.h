// The IR: one recurrent cell as straight-line SSA code.
//
// A Cell declares its per-step inputs, its recurrent states and its parameters (the arguments),
// then two blocks of instructions:
//   - `pre`: state-independent work hoisted out of the time loop. It runs once over all T*B rows
//     of the sequence before the loop (so `B` there means T*B rows) and may use only inputs,
//     parameters and earlier `pre` results. Every op is row-wise, so this equals running it per
//     step.
//   - `step`: the body of the time loop, run once per time step.
// and finally which value becomes each state's next value and which value is the step's output.
//
// Values are owned by the Cell (arguments) or by their Instr (results); operands are plain
// pointers into the same Cell. Numbering in printed IR is assigned by the printer, not stored.
#pragma once

#include "ir/Dim.h"
#include "ir/Ops.h"
#include "ir/ValueMap.h"

#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace rnnc::ir {

class Instr;

enum class ArgKind { Input, State, Param };
std::string_view argKindName(ArgKind kind); // "input", "state", "param"

class Value {
public:
  Shape shape;
  // Set for arguments; empty for instruction results.
  std::string name;
  ArgKind argKind = ArgKind::Input;
  // The defining instruction; null for arguments.
  Instr* def = nullptr;

  bool isArgument() const { return def == nullptr; }
  bool isBatched() const { return hasBatch(shape); }
};

struct Attrs {
  double value = 0; // const value, dropout probability or layernorm epsilon (see AttrKind)
  double lo = 0, hi = 0;
  double stream = 0; // dropout_mask: which of the cell's dropouts (a whole number)
  Dim offset;
};

// The number of columns of a bound value (its last dimension; 1 for a scalar).
int64_t columnsOf(const Value* value);
// The number of rows of a bound unbatched value (the product of its leading dimensions; 1 for a
// vector or scalar).
int64_t fixedRowsOf(const Value* value);

// The attributes of each AttrKind as the IR text spells them, in printed order, and where each
// lives in Attrs: the one list the printer and the parser read.
struct AttrField {
  const char* name;
  double Attrs::* number; // null for the offset, a dimension
};
std::span<const AttrField> attrFields(AttrKind kind);

class Instr {
public:
  Instr(Op op, std::vector<Value*> operands, Attrs attrs, Shape shape);
  Instr(const Instr&) = delete;
  Instr& operator=(const Instr&) = delete;

  Op op;
  std::vector<Value*> operands;
  Attrs attrs;
  Value result; // result.def == this
  // The fused kernel this instruction belongs to, or -1. A kernel's members are contiguous in
  // their block; values it defines and something outside it uses are the kernel's outputs, every
  // other value it defines lives only in registers.
  int kernel = -1;
};

// Whether an op may be part of a fused kernel: elementwise ops, views, and layer norm (the
// kernel then computes each row's statistics before its elementwise work).
bool isFusible(Op op);

using Block = std::vector<std::unique_ptr<Instr>>;

struct StateUpdate {
  Value* state = nullptr;
  Value* next = nullptr;
};

class Cell {
public:
  std::string name;
  // The named sizes the cell is written against, in declaration order, and those bound so far.
  std::vector<std::string> sizeNames;
  SizeMap sizes;

  std::vector<std::unique_ptr<Value>> inputs, states, params;
  Block pre, step;
  std::vector<StateUpdate> updates; // one per state, in state order
  Value* output = nullptr;

  Value* addArgument(ArgKind kind, const std::string& name, Shape shape);
  // The argument called `name`, or null.
  Value* findArgument(const std::string& name) const;
  const std::vector<std::unique_ptr<Value>>& arguments(ArgKind kind) const;

  // The update of `state`, or null.
  const StateUpdate* updateOf(const Value* state) const;

  // Binds named sizes: substitutes them into every shape and attribute. Throws UserError for a
  // name the cell does not declare or a non-positive value.
  void bindSizes(const SizeMap& bindings);

  // A deep copy; operands point into the copy.
  std::unique_ptr<Cell> clone() const;
};

// Replaces every use of `from` (operands, updates, output) by `to`.
void replaceAllUses(Cell& cell, Value* from, Value* to);
// Whether any instruction of the cell (pre or step block) is an `op`.
bool containsOp(const Cell& cell, Op op);

// The number of values the cell has: its arguments and every instruction's result (what a
// ValueMap over all of them is sized for).
size_t valueCount(const Cell& cell);

// The number of uses of `value` (operands, updates, output).
int countUses(const Cell& cell, const Value* value);
// Every value's number of uses at once, for passes that ask about many values: countUses per
// value would make them quadratic in the cell's size (cubic for an add tree walked from each
// of its nodes).
ValueMap<int> useCounts(const Cell& cell);

// Whether `product` is a linear or matmul of a batched [B, K] operand by a matrix ([N, K] or
// [K, N]) that is known before the time loop: a parameter, or made by the pre block. Such a
// product's weights can be packed once, before any run, and the product computed by generated
// tiles (codegen/StoragePlan.h, PackedProduct).
bool hasPackableWeights(const Cell& cell, const Instr& product);

// The multiply-add work of one step of the cell's matrix products (linear and matmul, in the
// pre block and the step block alike), 2 * M * N * K each, at `batch` rows (the batch symbol);
// a product whose sizes are not all bound counts nothing. A sequence of T steps does T times
// this.
double matrixProductFlopsPerStep(const Cell& cell, int64_t batch);

} // namespace rnnc::ir
