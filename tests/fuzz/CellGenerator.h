// Random valid cells for the differential fuzzer (issue 13): cell-language source with 1-3 states
// and 1-2 inputs, K-way gate projections of inputs, states and temporaries (linear() with and
// without bias, x @ W^T, x @ W, of cat()s), chunks read raw or combined, layer norms, every
// elementwise op and constants, and an output that is a state, a next state or a temporary.
// Sizes are drawn per cell, including 1 and sizes that are no multiple of any vector width.
//
// Every cell is valid by construction (a parse error is a generator bug) and numerically tame:
// the generator tracks a bound on each value's magnitude and keeps exp, log, sqrt and division
// inside their comfortable domains, so interpreter and JIT agree to float rounding.
#pragma once

#include "ir/Dim.h"

#include <cstdint>
#include <string>

namespace rnnc::fuzz {

struct GeneratedCell {
  std::string source; // the cell, in the cell language
  ir::SizeMap sizes;  // a value for every size the cell's header names
};

// The same seed gives the same cell on every machine (no std:: distributions, which differ
// between standard libraries). Now and then a product's weight is made of parameters
// (0.5 * w + 0.5 * tanh(v), w * sigmoid(s), w - v / 4) rather than one; the JIT reduces such a
// weight (--weights-dtype) as it does a parameter, on every pipeline (passes/HoistParameters.h),
// as the interpreter's rounding of every product's weight models.
GeneratedCell generateCell(uint64_t seed);

} // namespace rnnc::fuzz
