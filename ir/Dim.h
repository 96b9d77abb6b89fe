// Dimensions of IR values.
//
// A dimension is an integer linear combination of named sizes plus a constant: `B`, `512`,
// `4*hidden_size`, `hidden_size + input_size`. Cells are written against named sizes and only
// bound to numbers when the weights are known, so shapes stay symbolic until then. `B` (the batch)
// is always symbolic: the same compiled cell runs any batch size.
//
// Linear forms are enough for every cell we know (gate stacking, concatenation, chunking) and keep
// equality decidable: two dims are equal iff their canonical forms are.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rnnc::ir {

// The symbol every per-step value carries as its leading dimension.
inline constexpr const char* kBatchSymbol = "B";

using SizeMap = std::map<std::string, int64_t>;

class Dim {
public:
  Dim() = default; // the constant 0
  static Dim constant(int64_t value);
  static Dim symbol(const std::string& name, int64_t coefficient = 1);

  bool isConstant() const { return terms_.empty(); }
  // The value of a constant dimension; only valid when isConstant().
  int64_t constantValue() const { return offset_; }
  const std::map<std::string, int64_t>& terms() const { return terms_; }
  int64_t offset() const { return offset_; }
  bool mentions(const std::string& symbol) const { return terms_.count(symbol) != 0; }

  Dim operator+(const Dim& other) const;
  Dim operator-(const Dim& other) const;
  Dim operator*(int64_t factor) const;
  // This dimension divided by n when every coefficient and the constant divide exactly.
  std::optional<Dim> exactlyDividedBy(int64_t n) const;
  // True when the dimension is >= 0 for every assignment of positive sizes (all coefficients and
  // the constant non-negative). Used to prove slices stay in bounds.
  bool isProvablyNonNegative() const;
  // True when the dimension is >= 1 for every assignment of positive sizes.
  bool isProvablyPositive() const;

  // Replaces every symbol that `sizes` binds by its value.
  Dim substitute(const SizeMap& sizes) const;
  // The value when every symbol is bound, else nullopt.
  std::optional<int64_t> evaluate(const SizeMap& sizes) const;

  std::string str() const; // canonical text: `4*hidden_size + 2`

  bool operator==(const Dim& other) const {
    return offset_ == other.offset_ && terms_ == other.terms_;
  }
  bool operator!=(const Dim& other) const { return !(*this == other); }

private:
  void normalize(); // drops zero coefficients
  std::map<std::string, int64_t> terms_;
  int64_t offset_ = 0;
};

using Shape = std::vector<Dim>;

// Whether a shape's rows are the batch ([B, ...]): per-sequence-element data rather than
// parameters or values derived only from them.
inline bool hasBatch(const Shape& shape) {
  return !shape.empty() && shape[0].mentions(kBatchSymbol);
}

std::string shapeStr(const Shape& shape); // `[B, 4*hidden_size]`
Shape substituteShape(const Shape& shape, const SizeMap& sizes);

} // namespace rnnc::ir
