// Weight layouts other than PyTorch's state_dict, converted to it on load:
//   - MIOpen's gate order (shared/seeds/003): LSTM i, f, o, g instead of i, f, g, o; GRU z, r, n
//     instead of r, z, n. Both are swaps of two gate blocks, so one function converts either way.
//   - One flat buffer, as cuDNN's flattened weights and PyTorch's _flat_weights order them: for
//     each layer, for each direction, weight_ih, weight_hh, bias_ih, bias_hh (and weight_hr with
//     projections), each in C order.
#pragma once

#include "runtime/data/SafeTensors.h"

#include <string>
#include <string_view>

namespace rnnc {

// torch.nn.LSTM(proj_size > 0) weights are the built-in lstm_proj cell's: the cell to load for
// `cell` when the weights (or the options) have projections.
std::string projectedCell(const std::string& cell, bool projected);
// Whether a state_dict has LSTM projections (weight_hr, weight_hr_l0).
bool holdsProjection(const TensorMap& weights);

// Swaps the gate blocks of every weight_ih/weight_hh/bias_ih/bias_hh tensor between PyTorch's
// and MIOpen's order. `mode` is lstm, lstm_proj or gru; the RNN cells have one gate and no order.
TensorMap swapMIOpenGateOrder(const TensorMap& weights, const std::string& mode);

struct FlatLayout {
  std::string mode = "lstm"; // lstm, lstm_proj, gru, rnn_tanh, rnn_relu
  int64_t inputSize = 0, hiddenSize = 0, projSize = 0;
  int numLayers = 1;
  bool bidirectional = false;
};

// The state_dict a flat buffer holds; a UserError when its size does not match the layout.
TensorMap unflattenWeights(const Tensor& flat, const FlatLayout& layout, const std::string& source);
// The same from a buffer's shape and little-endian floats (a mapped .npy file's data:
// viewNpyFloat32), each tensor copied straight out of it.
TensorMap unflattenWeights(const TensorShape& shape, std::string_view floats,
                           const FlatLayout& layout, const std::string& source);
// The flat buffer of a state_dict (the inverse, for tests and for exporting).
Tensor flattenWeights(const TensorMap& weights, const FlatLayout& layout);

} // namespace rnnc
