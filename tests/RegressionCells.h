// Cells that once stopped with an internal error in some pass setting while the interpreter ran
// them (issue 13's reproductions): every code generator runs them (tests/test_cell_regressions.cpp
// the CPU's, tests/test_gpu.cpp the GPU's emulated).
#pragma once

#include <utility>
#include <vector>

namespace rnnc::test {

// A bias-free input projection chunked and read raw inside the step: premultiply leaves a pre
// kernel of slices only ("no storage for a value the generated code reads").
inline const char* kRawChunks = R"(cell raw_chunks(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[2*hidden_size, input_size], u[hidden_size, hidden_size]
  a, b = chunk(x @ w^T, 2)
  h2 = tanh(a + h @ u^T) * b
  return h = h2; output h2
})";

// A minimal gated unit: without premultiply, fuse-matmul pulled the stacked input projection
// into the first kernel while its second slice was read by the next kernel.
inline const char* kMinimalGatedUnit = R"(cell mgu(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_f[hidden_size, input_size], u_f[hidden_size, hidden_size], b_f[hidden_size]
  param w_h[hidden_size, input_size], u_h[hidden_size, hidden_size], b_h[hidden_size]
  f = sigmoid(linear(x, w_f, b_f) + linear(h, u_f))
  hc = tanh(linear(x, w_h, b_h) + linear(f * h, u_h))
  h2 = (1 - f) * h + f * hc
  return h = h2; output h2
})";

// Two products of one operand by weights stored as `x @ W` ([K, N]): merge-gates makes them one
// product by the weights concatenated along N, which the backward of every linear cell has
// (dh W_hh and dh W_ih from one dgates). The JIT stored such weights wrongly once.
inline const char* kMergedMatMuls = R"(cell merged_matmuls(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_h[hidden_size, hidden_size], w_x[hidden_size, input_size]
  g = tanh(x @ w_x^T + h)
  p = g @ w_h
  q = g @ w_x
  h2 = tanh(p) * sigmoid(h)
  return h = h2; output q
})";

// A state whose next value is a chunk of a product read raw, in a kernel of views only: the
// storage plan had the kernel store it over the state, and a views-only kernel emits no code,
// so the state never changed. The backward step of every linear cell has this shape (the
// gradient of h is a chunk of dgates [W_hh | W_ih]).
inline const char* kRawChunkState = R"(cell raw_chunk_state(hidden_size) {
  input gy[hidden_size]
  state d[hidden_size]
  param w[2*hidden_size, hidden_size]
  a, b = chunk(linear(gy + d, w), 2)
  return d = a; output b
})";

// Found by the fuzzer: one value the next value of two states, where the kernel could store it
// over one state (h, read nowhere) but not the other (c, read by the products); the plan kept it
// in registers, and c's update read a value with no storage.
inline const char* kOneValueTwoStates = R"(cell one_value_two_states(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[3*hidden_size, hidden_size], b[3*hidden_size], u[4*hidden_size, hidden_size]
  param v[hidden_size, input_size]
  g1, g2, g3 = chunk(c @ w^T + b, 3)
  q1, q2, q3, q4 = chunk(c @ u^T, 4)
  n = g2 + x @ v^T
  return h = n, c = n; output q3
})";

inline const char* kBackwardLike = R"(cell backward_like(input_size, hidden_size) {
  input x[input_size], gy[hidden_size], m[hidden_size]
  state d[hidden_size]
  param w_ih[hidden_size, input_size], w_hh[hidden_size, hidden_size]
  g = (gy + d) * m
  a = g @ w_hh
  b = g @ w_ih
  o = cat(b, x, g, g)
  return d = a; output o
})";

inline const std::vector<std::pair<const char*, const char*>> kRegressionCells = {
    {"raw_chunks", kRawChunks},          {"mgu", kMinimalGatedUnit},
    {"merged_matmuls", kMergedMatMuls},  {"backward_like", kBackwardLike},
    {"raw_chunk_state", kRawChunkState}, {"one_value_two_states", kOneValueTwoStates}};

} // namespace rnnc::test
