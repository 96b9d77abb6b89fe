// onednn_rnn: times oneDNN's LSTM / linear-before-reset GRU / tanh RNN on one shape, forward
// inference or (--backward) training, and prints one line of JSON, for bench/compare. Standalone
// (C++17, oneDNN 2.x C++ API):
//
//   c++ -std=c++17 -O2 bench/onednn_rnn.cpp -ldnnl -fopenmp -o onednn_rnn
//   OMP_NUM_THREADS=2 ./onednn_rnn --cell lstm --seq 100 --batch 64 --input 512 --hidden 512
//
// fp32, one layer, one direction, forward_inference, PyTorch's semantics (lbr_gru is PyTorch's
// GRU: n = tanh(W_in x + b_in + r * (W_hn h + b_hn))). The weights are created in the user layout
// ldigo and reordered once, untimed, into the layout the primitive asks for (format_tag::any);
// inputs, initial states and weights are random. Only the primitive's execution is timed.
//
// --backward times one training step as bench/pytorch_rnn.py --backward and rnnc bench --backward
// do: forward_training (which keeps its states in a workspace) then the backward primitive
// (lstm_backward, lbr_gru_backward, vanilla_rnn_backward), with the gradient of y.sum() (ones for
// diff_dst_layer, zeros for the final states' gradients), giving the input's, the initial states'
// and every weight's and bias's gradient. The backward may want its weights in another layout than
// the forward: each gets its own copy, reordered once, untimed, as the forward's (a training loop
// whose weights change would pay that reorder at every step; here it is not timed). oneDNN adds
// into diff_weights and diff_bias, so they are zeroed before each step, outside the timed region.
//
// Threads: Debian's libdnnl is built with the OpenMP runtime (libgomp), so OMP_NUM_THREADS sets
// them; "threads" in the output is omp_get_max_threads() when this program is built with OpenMP
// (same libgomp as oneDNN's), else OMP_NUM_THREADS or the hardware's count.
#include "oneapi/dnnl/dnnl.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

struct Options {
  std::string cell = "lstm";
  long seq = 100, batch = 64, input = 512, hidden = 512;
  int repeat = 5, warmup = 1;
  bool backward = false; // time forward_training + backward instead of forward_inference
  bool int8 = false;     // --dtype int8: the u8s8 forward inference (LSTM, GRU)
};

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: onednn_rnn [--cell lstm|gru|rnn_tanh] [--seq T] [--batch B] [--input I] "
               "[--hidden H] [--repeat R] [--warmup W] [--backward] [--dtype fp32|int8]\n"
               "Times oneDNN's fp32 forward-inference LSTM (lstm_forward), GRU "
               "(lbr_gru_forward) or tanh RNN (vanilla_rnn_forward), or with --backward one "
               "training step (forward_training, then lstm_backward, lbr_gru_backward or "
               "vanilla_rnn_backward), or with --dtype int8 the int8 forward inference (u8 "
               "data, s8 weights per output channel; LSTM and GRU) with the input's "
               "quantization, and its error against fp32; threads from OMP_NUM_THREADS. Prints "
               "one line of JSON.\n");
  std::exit(code);
}

long parsePositive(const char* flag, const char* text, long min) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min) {
    std::fprintf(stderr, "onednn_rnn: %s wants an integer >= %ld, got '%s'\n", flag, min, text);
    std::exit(2);
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help")
      usage(0);
    if (a == "--backward") { // the one option without a value
      o.backward = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "onednn_rnn: unknown option or missing value: %s\n", a.c_str());
      usage(2);
    }
    const char* v = argv[++i];
    if (a == "--cell")
      o.cell = v;
    else if (a == "--seq")
      o.seq = parsePositive("--seq", v, 1);
    else if (a == "--batch")
      o.batch = parsePositive("--batch", v, 1);
    else if (a == "--input")
      o.input = parsePositive("--input", v, 1);
    else if (a == "--hidden")
      o.hidden = parsePositive("--hidden", v, 1);
    else if (a == "--repeat")
      o.repeat = static_cast<int>(parsePositive("--repeat", v, 1));
    else if (a == "--warmup")
      o.warmup = static_cast<int>(parsePositive("--warmup", v, 0));
    else if (a == "--dtype" && (std::string(v) == "fp32" || std::string(v) == "int8"))
      o.int8 = std::string(v) == "int8";
    else if (a == "--dtype") {
      std::fprintf(stderr, "onednn_rnn: --dtype must be fp32 or int8, got '%s'\n", v);
      std::exit(2);
    } else {
      std::fprintf(stderr, "onednn_rnn: unknown option %s\n", a.c_str());
      usage(2);
    }
  }
  if (o.cell != "lstm" && o.cell != "gru" && o.cell != "rnn_tanh") {
    std::fprintf(stderr, "onednn_rnn: --cell must be lstm, gru or rnn_tanh, got '%s'\n",
                 o.cell.c_str());
    std::exit(2);
  }
  if (o.int8 && (o.backward || o.cell == "rnn_tanh")) {
    std::fprintf(stderr, "onednn_rnn: --dtype int8 times the LSTM's and the GRU's inference\n");
    std::exit(2);
  }
  return o;
}

int threadCount() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  if (const char* env = std::getenv("OMP_NUM_THREADS"))
    if (int n = std::atoi(env); n > 0)
      return n;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#endif
}

const char* runtimeName() {
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
  return "omp";
#elif DNNL_CPU_RUNTIME == DNNL_RUNTIME_TBB
  return "tbb";
#elif DNNL_CPU_RUNTIME == DNNL_RUNTIME_SEQ
  return "seq";
#else
  return "other";
#endif
}

const char* isaName(dnnl::cpu_isa isa) {
  switch (isa) {
  case dnnl::cpu_isa::sse41:
    return "sse41";
  case dnnl::cpu_isa::avx:
    return "avx";
  case dnnl::cpu_isa::avx2:
    return "avx2";
  case dnnl::cpu_isa::avx2_vnni:
    return "avx2_vnni";
  case dnnl::cpu_isa::avx512_core:
    return "avx512_core";
  case dnnl::cpu_isa::avx512_core_vnni:
    return "avx512_core_vnni";
  case dnnl::cpu_isa::avx512_core_bf16:
    return "avx512_core_bf16";
  case dnnl::cpu_isa::avx512_core_amx:
    return "avx512_core_amx";
  default:
    return "other";
  }
}

const char* formatKindName(const memory::desc& md) {
  switch (md.data.format_kind) {
  case dnnl_blocked:
    return "blocked";
  case dnnl_format_kind_rnn_packed:
    return "rnn_packed";
  default:
    return "other";
  }
}

// A memory object of `md` filled with uniform values in [-scale, scale].
memory randomMemory(const memory::desc& md, const dnnl::engine& eng, std::mt19937& rng,
                    float scale) {
  memory m(md, eng);
  std::uniform_real_distribution<float> dist(-scale, scale);
  auto* p = static_cast<float*>(m.get_data_handle());
  size_t n = md.get_size() / sizeof(float);
  for (size_t i = 0; i < n; ++i)
    p[i] = dist(rng);
  return m;
}

// A memory object of `md` filled with `value` (for the gradients, blocked layouts only).
memory filledMemory(const memory::desc& md, const dnnl::engine& eng, float value) {
  memory m(md, eng);
  auto* p = static_cast<float*>(m.get_data_handle());
  std::fill(p, p + md.get_size() / sizeof(float), value);
  return m;
}

// Weights as a primitive wants them: `user` (ldigo) itself, or reordered once if the layouts
// differ.
memory preferredWeights(memory user, const memory::desc& wanted, const dnnl::engine& eng,
                        dnnl::stream& s) {
  if (wanted == user.get_desc())
    return user;
  memory dst(wanted, eng);
  dnnl::reorder(user, dst).execute(s, user, dst);
  s.wait();
  return dst;
}

// Sum of a float buffer, and whether any element is nonzero.
double sumOf(const memory& m, bool* nonzero) {
  const auto* p = static_cast<const float*>(m.get_data_handle());
  size_t n = m.get_desc().get_size() / sizeof(float);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    sum += p[i];
    if (p[i] != 0.0f && nonzero)
      *nonzero = true;
  }
  return sum;
}

// What a forward primitive reads and writes; the cell state's only for an LSTM.
struct ForwardMemory {
  memory x, h0, c0, wLayer, wIter, bias, y, hn, cn;
};
std::unordered_map<int, memory> forwardArgs(bool lstm, const ForwardMemory& m) {
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC_LAYER, m.x},
                                          {DNNL_ARG_SRC_ITER, m.h0},
                                          {DNNL_ARG_WEIGHTS_LAYER, m.wLayer},
                                          {DNNL_ARG_WEIGHTS_ITER, m.wIter},
                                          {DNNL_ARG_BIAS, m.bias},
                                          {DNNL_ARG_DST_LAYER, m.y},
                                          {DNNL_ARG_DST_ITER, m.hn}};
  if (lstm) {
    args[DNNL_ARG_SRC_ITER_C] = m.c0;
    args[DNNL_ARG_DST_ITER_C] = m.cn;
  }
  return args;
}

double medianOf(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  return n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
}

// --dtype int8: oneDNN's int8 RNN inference, as its int8 example sets it up. Data (the input and
// the hidden state) as u8 = round(x * scale + 128), one scale for both (x and h in [-1, 1]: 127);
// weights as s8 with a scale per gate row (127 / the row's largest |w| over W_ih and W_hh,
// whose scales oneDNN shares), quantized when reordered into the primitive's layout, untimed,
// as the fp32 weights are; the biases, the cell state and the output in fp32, the final hidden
// state in u8 (oneDNN wants it in the data's type). Timed: the input's and h0's quantization
// (reorders f32 -> u8, as PyTorch's dynamic quantization quantizes per call) and the primitive.
// The error: the output against the fp32 primitive's on the same weights and input, relative to
// its largest value.
int runInt8(const Options& o) {
  const bool lstm = o.cell == "lstm";
  const memory::dim T = o.seq, B = o.batch, I = o.input, H = o.hidden, L = 1, D = 1;
  const memory::dim G = lstm ? 4 : 3, biasG = 4;
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    std::mt19937 rng(12345);
    const float w = 1.0f / std::sqrt(static_cast<float>(H));
    const auto prop = dnnl::prop_kind::forward_inference;
    const auto dir = dnnl::rnn_direction::unidirectional_left2right;

    memory::desc xF32({T, B, I}, dt::f32, tag::tnc), xU8({T, B, I}, dt::u8, tag::tnc);
    memory::desc hF32({L, D, B, H}, dt::f32, tag::ldnc), hU8({L, D, B, H}, dt::u8, tag::ldnc);
    memory::desc yF32({T, B, H}, dt::f32, tag::tnc);
    memory::desc wLayerUser({L, D, I, G, H}, dt::f32, tag::ldigo);
    memory::desc wIterUser({L, D, H, G, H}, dt::f32, tag::ldigo);
    memory::desc bias({L, D, biasG, H}, dt::f32, tag::ldgo);
    auto anyWeights = [&](memory::dim in, dt type) {
      return memory::desc({L, D, in, G, H}, type, tag::any);
    };

    memory wLayerLdigo = randomMemory(wLayerUser, eng, rng, w);
    memory wIterLdigo = randomMemory(wIterUser, eng, rng, w);
    memory b = randomMemory(bias, eng, rng, w);
    memory x = randomMemory(xF32, eng, rng, 1.0f);
    memory h0 = randomMemory(hF32, eng, rng, 1.0f);
    memory c0 = randomMemory(hF32, eng, rng, 1.0f);

    // Per gate row (g, o): the largest |w| over both weights (ldigo: i outermost).
    std::vector<float> scales(static_cast<size_t>(G * H), 0.0f);
    for (const memory* m : {&wLayerLdigo, &wIterLdigo}) {
      const auto* p = static_cast<const float*>(m->get_data_handle());
      const size_t rows = m->get_desc().get_size() / sizeof(float) / scales.size();
      for (size_t i = 0; i < rows; ++i)
        for (size_t go = 0; go < scales.size(); ++go)
          scales[go] = std::max(scales[go], std::abs(p[i * scales.size() + go]));
    }
    for (float& scale : scales)
      scale = scale > 0 ? 127.0f / scale : 1.0f;
    dnnl::primitive_attr attr;
    attr.set_rnn_data_qparams(127.0f, 128.0f);
    attr.set_rnn_weights_qparams((1 << 3) | (1 << 4), scales); // per g and o of ldigo

    // The primitive for `type` weights and data (the fp32 one for the reference output).
    auto build = [&](dt data, dt weights, const dnnl::primitive_attr& a, memory::desc& wLayerMd,
                     memory::desc& wIterMd) -> dnnl::primitive {
      memory::desc x_(xF32.dims(), data, tag::tnc), h_(hF32.dims(), data, tag::ldnc);
      if (lstm) {
        dnnl::lstm_forward::desc d(prop, dir, x_, h_, hF32, anyWeights(I, weights),
                                   anyWeights(H, weights), bias, yF32, h_, hF32);
        dnnl::lstm_forward::primitive_desc pd(d, a, eng);
        wLayerMd = pd.weights_layer_desc();
        wIterMd = pd.weights_iter_desc();
        return dnnl::lstm_forward(pd);
      }
      dnnl::lbr_gru_forward::desc d(prop, dir, x_, h_, anyWeights(I, weights),
                                    anyWeights(H, weights), bias, yF32, h_);
      dnnl::lbr_gru_forward::primitive_desc pd(d, a, eng);
      wLayerMd = pd.weights_layer_desc();
      wIterMd = pd.weights_iter_desc();
      return dnnl::lbr_gru_forward(pd);
    };
    auto reordered = [&](memory from, const memory::desc& to, const dnnl::primitive_attr& a) {
      memory out(to, eng);
      dnnl::reorder(dnnl::reorder::primitive_desc(eng, from.get_desc(), eng, to, a))
          .execute(s, from, out);
      s.wait();
      return out;
    };

    memory::desc wLayerMd, wIterMd, wLayerF32Md, wIterF32Md;
    dnnl::primitive int8Prim = build(dt::u8, dt::s8, attr, wLayerMd, wIterMd);
    dnnl::primitive f32Prim =
        build(dt::f32, dt::f32, dnnl::primitive_attr(), wLayerF32Md, wIterF32Md);
    memory wLayer = reordered(wLayerLdigo, wLayerMd, attr),
           wIter = reordered(wIterLdigo, wIterMd, attr);
    memory xq(xU8, eng), h0q(hU8, eng), y(yF32, eng), hn(hU8, eng), cn(hF32, eng);
    dnnl::reorder quantizeX(dnnl::reorder::primitive_desc(eng, xF32, eng, xU8, attr));
    dnnl::reorder quantizeH(dnnl::reorder::primitive_desc(eng, hF32, eng, hU8, attr));
    auto args = forwardArgs(lstm, {xq, h0q, c0, wLayer, wIter, b, y, hn, cn});
    auto once = [&] {
      quantizeX.execute(s, x, xq);
      quantizeH.execute(s, h0, h0q);
      int8Prim.execute(s, args);
      s.wait();
    };
    for (int i = 0; i < o.warmup; ++i)
      once();
    std::vector<double> ms;
    for (int i = 0; i < o.repeat; ++i) {
      auto start = std::chrono::steady_clock::now();
      once();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }

    // The fp32 primitive on the same weights and data, once, for the error.
    memory yRef(yF32, eng), hnRef(hF32, eng), cnRef(hF32, eng);
    auto refArgs = forwardArgs(lstm, {x, h0, c0, preferredWeights(wLayerLdigo, wLayerF32Md, eng, s),
                                      preferredWeights(wIterLdigo, wIterF32Md, eng, s), b, yRef,
                                      hnRef, cnRef});
    f32Prim.execute(s, refArgs);
    s.wait();
    const auto* got = static_cast<const float*>(y.get_data_handle());
    const auto* want = static_cast<const float*>(yRef.get_data_handle());
    double largest = 0, maxError = 0, sumError = 0;
    for (memory::dim i = 0; i < T * B * H; ++i) {
      largest = std::max(largest, static_cast<double>(std::abs(want[i])));
      const double error = std::abs(static_cast<double>(got[i]) - want[i]);
      maxError = std::max(maxError, error);
      sumError += error;
    }
    if (!std::isfinite(sumError)) {
      std::fprintf(stderr, "onednn_rnn: the int8 output is not finite\n");
      return 1;
    }
    std::sort(ms.begin(), ms.end());
    const dnnl::version_t* v = dnnl::version();
    std::printf("{\"engine\":\"onednn\",\"cell\":\"%s\",\"T\":%ld,\"B\":%ld,\"I\":%ld,\"H\":%ld,"
                "\"threads\":%d,\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,"
                "\"repeat\":%d,\"warmup\":%d,\"runtime\":\"%s\",\"isa\":\"%s\","
                "\"weights_format\":\"%s\",\"version\":\"%d.%d.%d\",\"dtype\":\"int8\","
                "\"max_abs_error_relative\":%.6g,\"mean_abs_error\":%.6g,\"backward\":false}\n",
                o.cell.c_str(), static_cast<long>(T), static_cast<long>(B), static_cast<long>(I),
                static_cast<long>(H), threadCount(), medianOf(ms), ms.front(), ms.back(), o.repeat,
                o.warmup, runtimeName(), isaName(dnnl::get_effective_cpu_isa()),
                formatKindName(wLayerMd), v->major, v->minor, v->patch,
                largest > 0 ? maxError / largest : maxError,
                sumError / static_cast<double>(T * B * H));
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "onednn_rnn: oneDNN error %d: %s%s\n", static_cast<int>(e.status),
                 e.what(),
                 lstm ? "" : " (int8 lbr_gru, PyTorch's GRU, is not implemented by this oneDNN)");
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.int8)
    return runInt8(o);
  const bool lstm = o.cell == "lstm", gru = o.cell == "gru";
  const memory::dim T = o.seq, B = o.batch, I = o.input, H = o.hidden;
  const memory::dim L = 1, D = 1;
  const memory::dim G = lstm ? 4 : gru ? 3 : 1; // gates in the weights
  // LSTM: 4 gate biases; lbr_gru: 3, plus the candidate's hidden-side bias (PyTorch's b_hn); the
  // vanilla RNN one (PyTorch's b_ih + b_hh, summed)
  const memory::dim biasG = lstm || gru ? 4 : 1;

  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    std::mt19937 rng(12345);
    const float w = 1.0f / std::sqrt(static_cast<float>(H)); // torch.nn.LSTM's init range

    memory::desc srcLayer({T, B, I}, dt::f32, tag::tnc);
    memory::desc dstLayer({T, B, H}, dt::f32, tag::tnc);
    memory::desc iter({L, D, B, H}, dt::f32, tag::ldnc);
    memory::desc wLayerUser({L, D, I, G, H}, dt::f32, tag::ldigo);
    memory::desc wIterUser({L, D, H, G, H}, dt::f32, tag::ldigo);
    memory::desc wLayerAny({L, D, I, G, H}, dt::f32, tag::any);
    memory::desc wIterAny({L, D, H, G, H}, dt::f32, tag::any);
    memory::desc bias({L, D, biasG, H}, dt::f32, tag::ldgo);

    // Training keeps the forward's states in a workspace for the backward.
    const auto prop =
        o.backward ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    const auto dir = dnnl::rnn_direction::unidirectional_left2right;
    dnnl::primitive prim, backPrim;
    // The backward's layouts (weights, gradients), queried below when training.
    dnnl::rnn_primitive_desc_base backPd;
    memory::desc wLayerMd, wIterMd, workspaceMd;
    if (lstm) {
      dnnl::lstm_forward::desc d(prop, dir, srcLayer, iter, iter, wLayerAny, wIterAny, bias,
                                 dstLayer, iter, iter);
      dnnl::lstm_forward::primitive_desc pd(d, eng);
      wLayerMd = pd.weights_layer_desc();
      wIterMd = pd.weights_iter_desc();
      workspaceMd = pd.workspace_desc();
      prim = dnnl::lstm_forward(pd);
      if (o.backward) {
        dnnl::lstm_backward::desc bd(dnnl::prop_kind::backward, dir, srcLayer, iter, iter,
                                     wLayerAny, wIterAny, bias, dstLayer, iter, iter, srcLayer,
                                     iter, iter, wLayerAny, wIterAny, bias, dstLayer, iter, iter);
        dnnl::lstm_backward::primitive_desc bpd(bd, eng, pd);
        backPd = bpd;
        backPrim = dnnl::lstm_backward(bpd);
      }
    } else if (gru) {
      dnnl::lbr_gru_forward::desc d(prop, dir, srcLayer, iter, wLayerAny, wIterAny, bias, dstLayer,
                                    iter);
      dnnl::lbr_gru_forward::primitive_desc pd(d, eng);
      wLayerMd = pd.weights_layer_desc();
      wIterMd = pd.weights_iter_desc();
      workspaceMd = pd.workspace_desc();
      prim = dnnl::lbr_gru_forward(pd);
      if (o.backward) {
        dnnl::lbr_gru_backward::desc bd(dnnl::prop_kind::backward, dir, srcLayer, iter, wLayerAny,
                                        wIterAny, bias, dstLayer, iter, srcLayer, iter, wLayerAny,
                                        wIterAny, bias, dstLayer, iter);
        dnnl::lbr_gru_backward::primitive_desc bpd(bd, eng, pd);
        backPd = bpd;
        backPrim = dnnl::lbr_gru_backward(bpd);
      }
    } else {
      dnnl::vanilla_rnn_forward::desc d(prop, dnnl::algorithm::eltwise_tanh, dir, srcLayer, iter,
                                        wLayerAny, wIterAny, bias, dstLayer, iter);
      dnnl::vanilla_rnn_forward::primitive_desc pd(d, eng);
      wLayerMd = pd.weights_layer_desc();
      wIterMd = pd.weights_iter_desc();
      workspaceMd = pd.workspace_desc();
      prim = dnnl::vanilla_rnn_forward(pd);
      if (o.backward) {
        dnnl::vanilla_rnn_backward::desc bd(dnnl::prop_kind::backward,
                                            dnnl::algorithm::eltwise_tanh, dir, srcLayer, iter,
                                            wLayerAny, wIterAny, bias, dstLayer, iter, srcLayer,
                                            iter, wLayerAny, wIterAny, bias, dstLayer, iter);
        dnnl::vanilla_rnn_backward::primitive_desc bpd(bd, eng, pd);
        backPd = bpd;
        backPrim = dnnl::vanilla_rnn_backward(bpd);
      }
    }

    memory wLayerLdigo = randomMemory(wLayerUser, eng, rng, w);
    memory wIterLdigo = randomMemory(wIterUser, eng, rng, w);
    memory wLayer = preferredWeights(wLayerLdigo, wLayerMd, eng, s);
    memory wIter = preferredWeights(wIterLdigo, wIterMd, eng, s);
    memory b = randomMemory(bias, eng, rng, w);
    memory x = randomMemory(srcLayer, eng, rng, 1.0f);
    memory h0 = randomMemory(iter, eng, rng, 1.0f);
    memory c0 = randomMemory(iter, eng, rng, 1.0f);
    memory y(dstLayer, eng), hn(iter, eng), cn(iter, eng);

    auto args = forwardArgs(lstm, {x, h0, c0, wLayer, wIter, b, y, hn, cn});

    // Training: the backward reads the forward's arguments and workspace, and writes every
    // gradient. The gradient of y.sum(): ones for y, zeros for the final states.
    std::unordered_map<int, memory> backArgs;
    memory backWLayer, backWIter, dx, dWLayer, dWIter, dBias;
    if (o.backward) {
      memory workspace(workspaceMd, eng);
      args[DNNL_ARG_WORKSPACE] = workspace;
      backWLayer = preferredWeights(wLayerLdigo, backPd.weights_layer_desc(), eng, s);
      backWIter = preferredWeights(wIterLdigo, backPd.weights_iter_desc(), eng, s);
      dx = memory(backPd.diff_src_layer_desc(), eng);
      dWLayer = memory(backPd.diff_weights_layer_desc(), eng);
      dWIter = memory(backPd.diff_weights_iter_desc(), eng);
      dBias = memory(backPd.diff_bias_desc(), eng);
      backArgs = args;
      backArgs[DNNL_ARG_WEIGHTS_LAYER] = backWLayer;
      backArgs[DNNL_ARG_WEIGHTS_ITER] = backWIter;
      backArgs[DNNL_ARG_DIFF_SRC_LAYER] = dx;
      backArgs[DNNL_ARG_DIFF_SRC_ITER] = memory(backPd.diff_src_iter_desc(), eng);
      backArgs[DNNL_ARG_DIFF_WEIGHTS_LAYER] = dWLayer;
      backArgs[DNNL_ARG_DIFF_WEIGHTS_ITER] = dWIter;
      backArgs[DNNL_ARG_DIFF_BIAS] = dBias;
      backArgs[DNNL_ARG_DIFF_DST_LAYER] = filledMemory(backPd.diff_dst_layer_desc(), eng, 1.0f);
      backArgs[DNNL_ARG_DIFF_DST_ITER] = filledMemory(backPd.diff_dst_iter_desc(), eng, 0.0f);
      if (lstm) {
        backArgs[DNNL_ARG_DIFF_SRC_ITER_C] = memory(backPd.diff_src_iter_c_desc(), eng);
        backArgs[DNNL_ARG_DIFF_DST_ITER_C] = filledMemory(backPd.diff_dst_iter_c_desc(), eng, 0.0f);
      }
    }
    // oneDNN adds the weights' and bias's gradients into diff_weights / diff_bias (as autograd
    // into .grad): zeroed before each step, untimed, so each step's are one step's.
    auto zeroGradients = [&] {
      for (memory* m : {&dWLayer, &dWIter, &dBias})
        std::memset(m->get_data_handle(), 0, m->get_desc().get_size());
    };

    auto once = [&] {
      prim.execute(s, args);
      if (o.backward)
        backPrim.execute(s, backArgs);
      s.wait();
    };
    for (int i = 0; i < o.warmup; ++i) {
      if (o.backward)
        zeroGradients();
      once();
    }
    std::vector<double> ms;
    for (int i = 0; i < o.repeat; ++i) {
      if (o.backward)
        zeroGradients();
      auto start = std::chrono::steady_clock::now();
      once();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = medianOf(ms);

    // A checksum of the last output, so a broken run shows as NaN rather than a fast time.
    const auto* yp = static_cast<const float*>(y.get_data_handle());
    double checksum = 0;
    for (memory::dim i = 0; i < T * B * H; ++i)
      checksum += yp[i];
    if (!std::isfinite(checksum)) {
      std::fprintf(stderr, "onednn_rnn: the output is not finite\n");
      return 1;
    }
    // Training: the input's gradient must be finite and not all zeros (a backward that did not
    // run), and the weights' and bias's finite.
    if (o.backward) {
      bool moved = false;
      double grads = sumOf(dx, &moved);
      for (const memory* m : {&dWLayer, &dWIter, &dBias})
        grads += sumOf(*m, nullptr);
      if (!std::isfinite(grads) || !moved) {
        std::fprintf(stderr, "onednn_rnn: the gradients are %s\n",
                     moved ? "not finite" : "all zeros");
        return 1;
      }
    }

    const dnnl::version_t* v = dnnl::version();
    // Whether any weights the timed primitives read are not ldigo (the backward's copies too).
    bool reordered = wLayerMd != wLayerUser || wIterMd != wIterUser;
    if (o.backward)
      reordered =
          reordered || backWLayer.get_desc() != wLayerUser || backWIter.get_desc() != wIterUser;
    std::printf("{\"engine\":\"onednn\",\"cell\":\"%s\",\"T\":%ld,\"B\":%ld,\"I\":%ld,\"H\":%ld,"
                "\"threads\":%d,\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,"
                "\"repeat\":%d,\"warmup\":%d,\"runtime\":\"%s\",\"isa\":\"%s\","
                "\"weights_format\":\"%s\",\"weights_reordered\":%s,\"version\":\"%d.%d.%d\","
                "\"checksum\":%.6g,\"backward\":%s}\n",
                o.cell.c_str(), static_cast<long>(T), static_cast<long>(B), static_cast<long>(I),
                static_cast<long>(H), threadCount(), median, ms.front(), ms.back(), o.repeat,
                o.warmup, runtimeName(), isaName(dnnl::get_effective_cpu_isa()),
                formatKindName(wLayerMd), reordered ? "true" : "false", v->major, v->minor,
                v->patch, checksum, o.backward ? "true" : "false");
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "onednn_rnn: oneDNN error %d: %s\n", static_cast<int>(e.status), e.what());
    return 1;
  }
  return 0;
}
