// Reads the text that ir/Printer writes (grammar in ir/README.md) back into a Cell, checking each
// instruction's written shape against the shape rules, then runs the verifier. Errors name the
// file, line and column.
#pragma once

#include "ir/Cell.h"

#include <memory>
#include <string>

namespace rnnc::ir {

std::unique_ptr<Cell> parseIR(const std::string& text, const std::string& file = "<ir>");

} // namespace rnnc::ir
