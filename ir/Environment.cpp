#include "ir/Environment.h"

#include "ir/Error.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

namespace rnnc {

int64_t environmentLimit(const char* name, int64_t fallback, const char* what, int64_t most) {
  const char* given = std::getenv(name);
  if (!given || !*given)
    return fallback;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(given, &end, 10);
  if (*end != '\0' || errno == ERANGE || value < 1 || value > most)
    throw UserError(fmt::format("{}='{}' is not {}", name, given, what));
  return value;
}

} // namespace rnnc
