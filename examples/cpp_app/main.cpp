// A program that uses rnnc through its installed package only (see CMakeLists.txt): a two-layer
// bidirectional LSTM with PyTorch's weight names, run by the JIT and by the reference
// interpreter on the same batch, which must agree.
#include <rnnc/rnnc.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

int main() {
  const int64_t input = 6, hidden = 8, steps = 5, batch = 3, layers = 2;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uniform(-0.3f, 0.3f);
  auto random = [&](std::vector<int64_t> shape) {
    rnnc::WeightTensor t{shape, {}};
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    for (int64_t i = 0; i < n; ++i)
      t.values.push_back(uniform(rng));
    return t;
  };
  std::map<std::string, rnnc::WeightTensor> weights;
  for (int64_t l = 0; l < layers; ++l)
    for (std::string suffix : {"", "_reverse"}) {
      std::string s = "_l" + std::to_string(l) + suffix;
      weights["weight_ih" + s] = random({4 * hidden, l == 0 ? input : 2 * hidden});
      weights["weight_hh" + s] = random({4 * hidden, hidden});
      weights["bias_ih" + s] = random({4 * hidden});
      weights["bias_hh" + s] = random({4 * hidden});
    }
  rnnc::LayerSpec spec; // the built-in LSTM; layers and directions from the weights
  rnnc::Layer jit = rnnc::Layer::fromWeights(spec, weights);
  spec.jit = false;
  rnnc::Layer interpreter = rnnc::Layer::fromWeights(spec, weights);

  std::vector<float> x = random({steps, batch, input}).values;
  std::vector<float> a(steps * batch * jit.outputSize()), b(a.size());
  std::vector<float> hnA(layers * 2 * batch * hidden), hnB(hnA.size());
  jit.forward(x.data(), steps, batch, nullptr, nullptr, nullptr, a.data(), hnA.data(), nullptr);
  interpreter.forward(x.data(), steps, batch, nullptr, nullptr, nullptr, b.data(), hnB.data(),
                      nullptr);
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::fmax(worst, std::fabs(a[i] - b[i]));
  for (size_t i = 0; i < hnA.size(); ++i)
    worst = std::fmax(worst, std::fabs(hnA[i] - hnB[i]));
  std::printf("cpp_app: %d layers x %d directions, output [%lld, %lld, %lld]; JIT and "
              "interpreter differ by at most %.2e\n",
              jit.numLayers(), jit.numDirections(), static_cast<long long>(steps),
              static_cast<long long>(batch), static_cast<long long>(jit.outputSize()), worst);
  if (!(worst <= 1e-5f)) {
    std::printf("cpp_app: FAILED\n");
    return 1;
  }
  // Done with rnnc for now: the memory it kept for reuse goes back to the system.
  rnnc::releaseCachedMemory();
  if (rnnc::cachedMemoryBytes() != 0) {
    std::printf("cpp_app: FAILED: memory is still kept after releaseCachedMemory()\n");
    return 1;
  }
  std::printf("cpp_app: OK\n");
  return 0;
}
