// The built-in cells: the files in cells/, embedded in the binary at build time.
#pragma once

#include "ir/Cell.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rnnc::frontend {

std::vector<std::string> builtinCellNames();
std::optional<std::string_view> builtinCellSource(std::string_view name);

// A cell given as a built-in name (`lstm`), as the path of a .cell file, or as the path of an IR
// dump (`.rnnir`: what `rnnc dump` and --print-after-all print, maybe edited by hand). A path is
// anything that names an existing file or ends in `.cell`; an unknown name lists the built-ins.
std::unique_ptr<ir::Cell> loadCell(const std::string& nameOrPath);

} // namespace rnnc::frontend
