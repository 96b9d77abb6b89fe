// Small helpers shared by the subcommands for options of the form NAME=VALUE.
#pragma once

#include "ir/Dim.h"

#include <string>
#include <utility>
#include <vector>

namespace rnnc::tools {

// Splits "NAME=VALUE"; throws UserError naming the option when there is no '='.
std::pair<std::string, std::string> splitAssignment(const std::string& text,
                                                    const std::string& option);

// Parses repeated `--size NAME=VALUE` options.
ir::SizeMap parseSizes(const std::vector<std::string>& assignments);

} // namespace rnnc::tools
