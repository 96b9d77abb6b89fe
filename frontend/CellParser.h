// The cell language: parses a `.cell` text and lowers it to an ir::Cell in one pass, checking
// names and shapes as it goes. Every error names file:line:col with a caret under the culprit.
// The grammar is in README.md ("The cell language").
#pragma once

#include "ir/Cell.h"

#include <memory>
#include <string>

namespace rnnc::frontend {

std::unique_ptr<ir::Cell> parseCell(const std::string& source, const std::string& file);
std::unique_ptr<ir::Cell> parseCellFile(const std::string& path);

} // namespace rnnc::frontend
