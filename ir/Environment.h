// Limits users may raise through the environment (RNNC_MAX_THREADS, RNNC_MAX_FILE_BYTES,
// RNNC_CACHE_MAX_BYTES, ...), read one way everywhere.
#pragma once

#include <cstdint>
#include <limits>

namespace rnnc {

// The positive integer in environment variable `name`, or `fallback` when it is unset or empty.
// Anything else (not a number, below 1, above `most`) is a UserError naming the variable and
// saying it is not `what` ("a byte count").
int64_t environmentLimit(const char* name, int64_t fallback, const char* what,
                         int64_t most = std::numeric_limits<int64_t>::max());

} // namespace rnnc
