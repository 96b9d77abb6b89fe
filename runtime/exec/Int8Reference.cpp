#include "runtime/exec/Int8Reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace rnnc {
namespace {

constexpr float kLevels = 127;

float roundClamped(float v, float lowest, float highest) {
  return std::clamp(std::nearbyint(v), lowest, highest);
}

} // namespace

void int8ReferenceProduct(const float* x, int64_t rows, int64_t depth, const float* w,
                          int64_t columns, bool weightsByRow, float* y) {
  auto weight = [&](int64_t column, int64_t k) {
    return weightsByRow ? w[column * depth + k] : w[k * columns + column];
  };
  // The weights, per channel: levels, their sum, the scale (NaN for a non-finite channel).
  std::vector<int> levels(static_cast<size_t>(columns * depth));
  std::vector<int64_t> levelSums(static_cast<size_t>(columns));
  std::vector<float> weightScales(static_cast<size_t>(columns));
  for (int64_t j = 0; j < columns; ++j) {
    float largest = 0;
    bool finite = true;
    for (int64_t k = 0; k < depth; ++k) {
      finite = finite && std::isfinite(weight(j, k));
      largest = std::max(largest, std::fabs(weight(j, k)));
    }
    float scale = largest / kLevels;
    if (scale == 0)
      scale = 1;
    int64_t sum = 0;
    for (int64_t k = 0; k < depth; ++k) {
      const int q =
          finite ? static_cast<int>(roundClamped(weight(j, k) / scale, -kLevels, kLevels)) : 0;
      levels[static_cast<size_t>(j * depth + k)] = q;
      sum += q;
    }
    levelSums[static_cast<size_t>(j)] = sum;
    weightScales[static_cast<size_t>(j)] = finite ? scale : std::numeric_limits<float>::quiet_NaN();
  }
  std::vector<int> q(static_cast<size_t>(depth));
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x + i * depth;
    float low = 0, high = 0;
    bool finite = true;
    for (int64_t k = 0; k < depth; ++k) {
      finite = finite && std::isfinite(row[k]);
      low = std::min(low, row[k]);
      high = std::max(high, row[k]);
    }
    float scale = (high - low) / kLevels;
    if (scale == 0)
      scale = 1;
    const float zero = finite ? roundClamped(-low / scale, 0, kLevels) : 0;
    for (int64_t k = 0; k < depth; ++k)
      q[static_cast<size_t>(k)] =
          finite ? static_cast<int>(std::clamp(
                       roundClamped(row[k] * (1 / scale), -kLevels, kLevels) + zero, 0.0f, kLevels))
                 : 0;
    const float rowScale = finite ? scale : std::numeric_limits<float>::quiet_NaN();
    for (int64_t j = 0; j < columns; ++j) {
      int64_t sum = 0;
      for (int64_t k = 0; k < depth; ++k)
        sum += static_cast<int64_t>(q[static_cast<size_t>(k)]) *
               levels[static_cast<size_t>(j * depth + k)];
      const float corrected =
          static_cast<float>(sum) - zero * static_cast<float>(levelSums[static_cast<size_t>(j)]);
      y[i * columns + j] = corrected * (rowScale * weightScales[static_cast<size_t>(j)]);
    }
  }
}

} // namespace rnnc
