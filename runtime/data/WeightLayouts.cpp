#include "runtime/data/WeightLayouts.h"

#include "ir/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace rnnc {
namespace {

int gatesOf(const std::string& mode) {
  if (mode == "lstm" || mode == "lstm_proj")
    return 4;
  if (mode == "gru")
    return 3;
  if (mode == "rnn_tanh" || mode == "rnn_relu")
    return 1;
  throw UserError("weight layouts are defined for lstm, lstm_proj, gru, rnn_tanh and rnn_relu, "
                  "not '" +
                  mode + "'");
}

bool isGateStacked(const std::string& name) {
  for (const char* prefix : {"weight_ih", "weight_hh", "bias_ih", "bias_hh"})
    if (name.starts_with(prefix))
      return true;
  return false;
}

// The tensor names and shapes of one layer and direction, in flat-buffer order.
std::vector<std::pair<std::string, TensorShape>> flatEntries(const FlatLayout& l) {
  const int64_t gates = gatesOf(l.mode) * l.hiddenSize;
  const int64_t hOut = l.projSize > 0 ? l.projSize : l.hiddenSize;
  const int directions = l.bidirectional ? 2 : 1;
  std::vector<std::pair<std::string, TensorShape>> entries;
  for (int layer = 0; layer < l.numLayers; ++layer)
    for (int d = 0; d < directions; ++d) {
      std::string suffix = fmt::format("_l{}{}", layer, d ? "_reverse" : "");
      int64_t in = layer == 0 ? l.inputSize : directions * hOut;
      entries.push_back({"weight_ih" + suffix, {gates, in}});
      entries.push_back({"weight_hh" + suffix, {gates, hOut}});
      entries.push_back({"bias_ih" + suffix, {gates}});
      entries.push_back({"bias_hh" + suffix, {gates}});
      if (l.projSize > 0)
        entries.push_back({"weight_hr" + suffix, {l.projSize, l.hiddenSize}});
    }
  return entries;
}

} // namespace

std::string projectedCell(const std::string& cell, bool projected) {
  return cell == "lstm" && projected ? "lstm_proj" : cell;
}

bool holdsProjection(const TensorMap& weights) {
  return weights.count("weight_hr_l0") || weights.count("weight_hr");
}

TensorMap swapMIOpenGateOrder(const TensorMap& weights, const std::string& mode) {
  const int gates = gatesOf(mode);
  // The two gate blocks that trade places: LSTM g and o, GRU r and z.
  const std::pair<int, int> swapped = gates == 4 ? std::pair{2, 3} : std::pair{0, 1};
  TensorMap out = weights;
  if (gates == 1)
    return out;
  for (auto& [name, tensor] : out) {
    if (!isGateStacked(name))
      continue;
    const int64_t rows = tensor.dim(0);
    if (rows % gates != 0)
      throw UserError(
          fmt::format("tensor '{}' has {} rows, not a multiple of {} gates", name, rows, gates));
    const int64_t block = rows / gates * (tensor.numel() / rows); // floats per gate
    float* a = tensor.data() + swapped.first * block;
    float* b = tensor.data() + swapped.second * block;
    std::swap_ranges(a, a + block, b);
  }
  return out;
}

TensorMap unflattenWeights(const TensorShape& shape, std::string_view floats,
                           const FlatLayout& layout, const std::string& source) {
  auto entries = flatEntries(layout);
  int64_t expected = 0;
  for (const auto& [name, entryShape] : entries)
    expected += numElements(entryShape);
  if (shape.size() != 1 || shape[0] != expected)
    throw UserError(fmt::format(
        "{}: flat weights have shape {}, expected [{}] for {} layer(s) "
        "of {}{} with input_size {}, hidden_size {}{}",
        source, shapeToString(shape), expected, layout.numLayers, layout.mode,
        layout.bidirectional ? " in both directions" : "", layout.inputSize, layout.hiddenSize,
        layout.projSize > 0 ? fmt::format(", proj_size {}", layout.projSize) : ""));
  RNNC_INTERNAL_CHECK(floats.size() == static_cast<size_t>(expected) * sizeof(float),
                      "flat weights' bytes do not match their shape");
  TensorMap weights;
  size_t at = 0;
  for (const auto& [name, entryShape] : entries) {
    // Straight from the file's mapping into each tensor's own memory: a flat tensor in between
    // was megabytes of fresh memory to fault in (on huge pages, zeroed whole) and copy twice (a
    // warm `rnnc run` at I=H=256), and so was a temporary vector per matrix before that.
    const size_t bytes = static_cast<size_t>(numElements(entryShape)) * sizeof(float);
    weights[name] = Tensor::ofBytes(entryShape, floats.substr(at, bytes));
    at += bytes;
  }
  return weights;
}

TensorMap unflattenWeights(const Tensor& flat, const FlatLayout& layout,
                           const std::string& source) {
  const std::string_view floats(reinterpret_cast<const char*>(flat.data()),
                                static_cast<size_t>(flat.numel()) * sizeof(float));
  return unflattenWeights(flat.shape(), floats, layout, source);
}

Tensor flattenWeights(const TensorMap& weights, const FlatLayout& layout) {
  std::vector<float> flat;
  for (const auto& [name, shape] : flatEntries(layout)) {
    auto it = weights.find(name);
    if (it == weights.end() || it->second.shape() != shape)
      throw UserError(fmt::format("flattening: tensor '{}' is {}, expected shape {}", name,
                                  it == weights.end() ? "missing" : it->second.shapeString(),
                                  shapeToString(shape)));
    flat.insert(flat.end(), it->second.values().begin(), it->second.values().end());
  }
  const int64_t n = static_cast<int64_t>(flat.size());
  return Tensor({n}, std::move(flat));
}

} // namespace rnnc
