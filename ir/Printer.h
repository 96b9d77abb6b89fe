// Prints a Cell as deterministic SSA text that ir/IRParser reads back: printing, parsing and
// printing again gives the same text. Instruction results are numbered %0, %1, ... in program
// order (pre block first); arguments keep their names. See ir/README.md for the grammar.
#pragma once

#include "ir/Cell.h"

#include <ostream>
#include <string>

namespace rnnc::ir {

void print(std::ostream& os, const Cell& cell);
std::string toString(const Cell& cell);
std::ostream& operator<<(std::ostream& os, const Cell& cell);

// Shortest text that reads back as the same double (`1e-05`, `0.5`, `-1`).
std::string formatNumber(double value);

} // namespace rnnc::ir
