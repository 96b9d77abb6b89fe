#pragma once

#include <cstdint>

namespace rnnc::tools {

// Runs `rnnc bench --eltwise` and prints its table.
int benchEltwise(int64_t batch, int64_t hidden, int repeat);

} // namespace rnnc::tools
