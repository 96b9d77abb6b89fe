// A cell with dropout of its input (the premultiply pass hoists the mask and the input product
// into the pre phase), of its state (drawn in the loop) and of its output: what the training
// dropout tests (test_training_dropout.cpp, test_gradients.cpp) run.
#pragma once

namespace rnnc::test {

inline constexpr const char* kDroppingCell = R"(cell dropping(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], b[hidden_size]
  h2 = tanh(linear(dropout(x, 0.3), w, b) + linear(dropout(h, 0.2), u))
  return h = h2; output dropout(h2, 0.5)
})";

} // namespace rnnc::test
