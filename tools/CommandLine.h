// Small helpers shared by the subcommands: options of the form NAME=VALUE, and --threads.
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

// Throws UserError unless `threads` (a --threads option) is 0 (automatic) or positive. Checked
// here rather than by a CLI11 validator, whose message spells out the largest double.
void checkThreadsOption(int threads);

} // namespace rnnc::tools
