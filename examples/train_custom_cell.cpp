// Trains a custom cell (examples/mgu.cell, a minimal gated unit) with plain SGD on the adding
// problem: each step of a sequence carries a value in [0, 1) and a marker; the target is half
// the sum of the two marked values, read from the first unit of the final state. rnnc runs
// the forward and the backward it derives from the cell; the loss falls as it learns.
//
//   train_custom_cell [iterations] [path/to/mgu.cell]
#include <rnnc/rnnc.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 1500;
  const std::string cellPath = argc > 2 ? argv[2] : RNNC_EXAMPLE_CELL;
  const int64_t steps = 8, batch = 32, input = 2, hidden = 12;
  const float learningRate = 0.5f;

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  auto matrix = [&](int64_t rows, int64_t cols) {
    rnnc::WeightTensor t{{rows, cols}, std::vector<float>(static_cast<size_t>(rows * cols))};
    for (float& v : t.values)
      v = normal(rng) / std::sqrt(static_cast<float>(cols));
    return t;
  };
  auto vector = [&](int64_t n) {
    return rnnc::WeightTensor{{n}, std::vector<float>(static_cast<size_t>(n), 0.0f)};
  };
  std::map<std::string, rnnc::WeightTensor> weights = {{"weight_f", matrix(hidden, input)},
                                                       {"weight_uf", matrix(hidden, hidden)},
                                                       {"bias_f", vector(hidden)},
                                                       {"weight_h", matrix(hidden, input)},
                                                       {"weight_uh", matrix(hidden, hidden)},
                                                       {"bias_h", vector(hidden)}};
  rnnc::LayerSpec spec;
  spec.cell = cellPath;
  spec.threads = 1;

  // Predicting the mean target scores 0.5 * Var((a + b) / 2) = 1/48: what a net that ignores the
  // sequence gets. Learning the task goes well below it.
  const float meanPredictor = 1.0f / 48;
  float recent = 0; // the loss averaged over the last 100 iterations
  for (int it = 0; it < iterations; ++it) {
    // A batch of the adding problem: [T, B, 2] (value, marker), two markers per sequence.
    std::vector<float> x(static_cast<size_t>(steps * batch * input));
    std::vector<float> target(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      int64_t a = rng() % steps, c = rng() % steps;
      while (c == a)
        c = rng() % steps;
      for (int64_t t = 0; t < steps; ++t) {
        float value = uniform(rng);
        x[(t * batch + b) * input] = value;
        x[(t * batch + b) * input + 1] = t == a || t == c ? 1.0f : 0.0f;
        if (t == a || t == c)
          target[b] += 0.5f * value;
      }
    }
    // The layer with this iteration's weights (compiled code is reused: the cell is the same).
    rnnc::Layer layer = rnnc::Layer::fromWeights(spec, weights);
    std::vector<float> y(static_cast<size_t>(steps * batch * hidden)), hn(batch * hidden);
    rnnc::TrainingRecord record = layer.forwardTraining(x.data(), steps, batch, nullptr, nullptr,
                                                        nullptr, y.data(), hn.data(), nullptr);
    // Loss 0.5 * mean (h_T[0] - target)^2; its gradient flows in through h_n only.
    float loss = 0;
    std::vector<float> gradHn(hn.size(), 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
      float error = hn[b * hidden] - target[b];
      loss += 0.5f * error * error / batch;
      gradHn[b * hidden] = error / batch;
    }
    std::map<std::string, rnnc::WeightTensor> grads =
        layer.backward(record, nullptr, gradHn.data(), nullptr);
    for (auto& [name, w] : weights)
      for (size_t i = 0; i < w.values.size(); ++i)
        w.values[i] -= learningRate * grads.at(name).values[i];

    recent += (loss - recent) / std::min(it + 1, 100);
    if (it % 100 == 0 || it == iterations - 1)
      std::printf("iteration %4d  loss %.5f  (training workspace %lld bytes)\n", it, loss,
                  static_cast<long long>(record.workspaceBytes()));
  }
  bool learned = recent < 0.25f * meanPredictor;
  std::printf("mean loss of the last 100 iterations %.5f, predicting the mean scores %.5f: %s\n",
              recent, meanPredictor, learned ? "learned" : "not learned yet");
  return learned ? 0 : 1;
}
