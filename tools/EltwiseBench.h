#pragma once

#include <cstdint>

namespace rnnc::tools {

// Runs `rnnc bench --eltwise` and prints its table, or (`json`) one JSON object.
int benchEltwise(int64_t batch, int64_t hidden, int repeat, bool json = false);

} // namespace rnnc::tools
