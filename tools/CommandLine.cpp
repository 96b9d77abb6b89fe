#include "tools/CommandLine.h"

#include "ir/Error.h"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

namespace rnnc::tools {

std::pair<std::string, std::string> splitAssignment(const std::string& text,
                                                    const std::string& option) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw UserError(option + " expects NAME=VALUE, got '" + text + "'");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

ir::SizeMap parseSizes(const std::vector<std::string>& assignments) {
  ir::SizeMap sizes;
  for (const auto& text : assignments) {
    auto [name, value] = splitAssignment(text, "--size");
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE || v <= 0)
      throw UserError("--size " + name + ": '" + value + "' is not a positive integer");
    if (sizes.count(name))
      throw UserError("--size " + name + " is given twice");
    sizes[name] = v;
  }
  return sizes;
}

void checkThreadsOption(int threads) {
  if (threads < 0)
    throw UserError(fmt::format("--threads must be 0 (automatic) or positive, got {}", threads));
}

} // namespace rnnc::tools
