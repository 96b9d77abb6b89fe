#include "tests/fuzz/CellGenerator.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace rnnc::fuzz {
namespace {

// A per-step value [B, dim] the cell can read, with a bound on its magnitude.
struct Value {
  std::string name;
  std::string dim; // a feature size: "hidden_size", or "input_size + hidden_size" for a cat
  double bound;
};

// An expression's text and the bound on its magnitude.
struct Expr {
  std::string text;
  double bound;
  bool constant = false; // a number alone
};

class Generator {
public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  GeneratedCell run() {
    declareArguments();
    emitGateGroups();
    emitTemporaries();
    emitProjectionsOfTemporaries();
    emitTemporaries();
    emitStateUpdates();
    return finish();
  }

private:
  // --- randomness that is the same with every standard library ---
  uint64_t next() { return rng_(); }
  int uniform(int lo, int hi) { return lo + static_cast<int>(next() % uint64_t(hi - lo + 1)); }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  template <class T> const T& pick(const std::vector<T>& items) {
    return items[next() % items.size()];
  }

  std::string fresh(const std::string& prefix) { return prefix + std::to_string(counter_++); }

  static std::string times(int k, const std::string& dim) {
    if (k == 1)
      return dim;
    if (dim.find('+') != std::string::npos)
      return fmt::format("{}*({})", k, dim);
    return fmt::format("{}*{}", k, dim);
  }

  void useSize(const std::string& name) {
    if (!sizes_.count(name)) {
      static const std::vector<int64_t> choices = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 23, 32, 33};
      sizes_[name] = pick(choices);
      sizeOrder_.push_back(name);
    }
  }
  void useDim(const std::string& dim) {
    for (const char* size : {"input_size", "hidden_size", "extra_size"})
      if (dim.find(size) != std::string::npos)
        useSize(size);
  }

  std::string param(const std::string& prefix, const std::string& shape) {
    // Dotted names as PyTorch's state_dict writes them, now and then.
    std::string name = chance(0.15) ? fmt::format("m{}.{}", counter_++, prefix) : fresh(prefix);
    params_.push_back(fmt::format("{}[{}]", name, shape));
    return name;
  }

  void line(const std::string& text) { lines_.push_back("  " + text); }

  // --- arguments ---
  void declareArguments() {
    inputs_.push_back({"x", "input_size", 1.0});
    useDim("input_size");
    if (chance(0.3)) {
      inputs_.push_back({"y", chance(0.5) ? "extra_size" : "input_size", 1.0});
      useDim(inputs_.back().dim);
    }
    states_.push_back({"h", "hidden_size", 1.0});
    useDim("hidden_size");
    int more = uniform(0, 2);
    static const char* names[] = {"c", "d"};
    for (int i = 0; i < more; ++i) {
      states_.push_back({names[i], chance(0.6) ? "hidden_size" : "extra_size", 1.0});
      useDim(states_.back().dim);
    }
    for (const Value& v : inputs_)
      pool_.push_back(v);
    for (const Value& v : states_)
      pool_.push_back(v);
  }

  std::vector<std::string> stateDims() const {
    std::vector<std::string> dims;
    for (const Value& s : states_)
      if (std::find(dims.begin(), dims.end(), s.dim) == dims.end())
        dims.push_back(s.dim);
    return dims;
  }

  // A product's weight of `shape` ("rows, columns"): a parameter, or now and then one made of
  // parameters alone (scaled, summed, squashed, a row broadcast over it), no larger.
  std::string weight(const std::string& shape, const std::string& columns) {
    std::string w = param("w", shape);
    switch (chance(0.15) ? uniform(0, 2) : -1) {
    case 0:
      return fmt::format("(0.5 * {} + 0.5 * tanh({}))", w, param("w", shape));
    case 1:
      return fmt::format("({} * sigmoid({}))", w, param("s", columns));
    case 2:
      return fmt::format("({} - {} / 4)", w, param("w", shape));
    }
    return w;
  }

  // A projection of `source` to k*dim features, in one of the language's spellings.
  Expr projection(const Value& source, const std::string& dim, int k, bool bias) {
    std::string out = times(k, dim);
    double bound = 3.0 * source.bound + (bias ? 0.4 : 0.0);
    int style = uniform(0, 3);
    if (style == 3 && !bias) { // x @ W: the weight stored transposed
      std::string w = weight(fmt::format("{}, {}", source.dim, out), out);
      return {fmt::format("{} @ {}", source.name, w), bound};
    }
    std::string w = weight(fmt::format("{}, {}", out, source.dim), source.dim);
    if (style == 2 && !bias)
      return {fmt::format("{} @ {}^T", source.name, w), bound};
    if (bias) {
      std::string b = param("b", out);
      if (style == 2) // the bias added by hand
        return {fmt::format("({} @ {}^T + {})", source.name, w, b), bound};
      return {fmt::format("linear({}, {}, {})", source.name, w, b), bound};
    }
    return {fmt::format("linear({}, {})", source.name, w), bound};
  }

  // What a gate group projects: an input, a state, or a cat of both.
  Value projectionSource() {
    std::vector<Value> candidates = inputs_;
    for (const Value& s : states_)
      candidates.push_back(s);
    // Every input is projected at least once: an unused input is an error.
    for (const Value& in : inputs_)
      if (!usedInputs_.count(in.name))
        return markUsed(in);
    if (chance(0.15)) {
      const Value& a = pick(inputs_);
      const Value& b = pick(states_);
      usedInputs_.insert(a.name);
      return {fmt::format("cat({}, {})", a.name, b.name), a.dim + " + " + b.dim, 1.0};
    }
    return markUsed(pick(candidates));
  }
  bool everyInputUsed() const {
    return std::all_of(inputs_.begin(), inputs_.end(),
                       [&](const Value& in) { return usedInputs_.count(in.name) > 0; });
  }
  Value markUsed(const Value& v) {
    usedInputs_.insert(v.name);
    return v;
  }

  // --- the gates ---
  // Groups like an LSTM's (one sum of projections, chunked) or a GRU's (each projection chunked,
  // the pieces combined later), some layer-normed, some with a bias vector added.
  void emitGateGroups() {
    int groups = uniform(1, 3);
    for (int g = 0; g < groups || !everyInputUsed(); ++g) {
      std::string dim = pick(stateDims());
      int k = uniform(1, 4);
      int terms = uniform(1, 2);
      bool chunkEach = terms > 1 && chance(0.35);
      std::vector<Expr> projections;
      for (int t = 0; t < terms; ++t) {
        Expr p = projection(projectionSource(), dim, k, chance(0.5));
        if (chance(0.15)) {
          p = layerNorm(p, times(k, dim));
        }
        projections.push_back(p);
      }
      if (chunkEach) {
        for (const Expr& p : projections)
          chunkInto(p, dim, k);
        continue;
      }
      Expr sum = projections[0];
      for (size_t t = 1; t < projections.size(); ++t)
        sum = {fmt::format("{} + {}", sum.text, projections[t].text),
               sum.bound + projections[t].bound};
      if (chance(0.2)) {
        std::string b = param("b", times(k, dim));
        sum = {fmt::format("{} + {}", sum.text, b), sum.bound + 0.4};
      }
      chunkInto(sum, dim, k);
    }
  }

  // Names `expr` and splits it into k values of `dim` features (sometimes in two rounds).
  void chunkInto(const Expr& expr, const std::string& dim, int k) {
    std::string whole = fresh("g");
    line(fmt::format("{} = {}", whole, expr.text));
    if (k == 1) {
      pool_.push_back({whole, dim, expr.bound});
      return;
    }
    if (k == 4 && chance(0.25)) { // halves, then quarters: slices of slices
      std::string front = fresh("g"), back = fresh("g");
      line(fmt::format("{}, {} = chunk({}, 2)", front, back, whole));
      for (const std::string& half : {front, back}) {
        std::string a = fresh("g"), b = fresh("g");
        line(fmt::format("{}, {} = chunk({}, 2)", a, b, half));
        pool_.push_back({a, dim, expr.bound});
        pool_.push_back({b, dim, expr.bound});
      }
      return;
    }
    std::vector<std::string> names;
    for (int i = 0; i < k; ++i)
      names.push_back(fresh("g"));
    line(fmt::format("{} = chunk({}, {})", fmt::join(names, ", "), whole, k));
    for (const std::string& n : names)
      pool_.push_back({n, dim, expr.bound});
  }

  // --- expressions ---
  std::vector<Value> valuesOf(const std::string& dim) const {
    std::vector<Value> out;
    for (const Value& v : pool_)
      if (v.dim == dim)
        out.push_back(v);
    return out;
  }

  Expr leaf(const std::string& dim) {
    int kind = uniform(0, 9);
    if (kind == 0) {
      static const std::vector<std::string> numbers = {"1", "0.5", "2", "0.25", "3", "1.5"};
      const std::string& n = pick(numbers);
      return {n, std::stod(n), true};
    }
    if (kind == 1)
      return {param("v", dim), 0.4};
    std::vector<Value> values = valuesOf(dim);
    const Value& v = pick(values);
    return {v.name, v.bound};
  }

  Expr tame(Expr e) {
    if (e.bound > 20)
      return {fmt::format("tanh({})", e.text), 1.0};
    return e;
  }

  // The value of a dimension this generator writes: "k*name" or "name".
  int64_t featureCount(const std::string& dim) const {
    size_t star = dim.find('*');
    if (star == std::string::npos)
      return sizes_.at(dim);
    return std::stoll(dim.substr(0, star)) * sizes_.at(dim.substr(star + 1));
  }

  Expr layerNorm(const Expr& e, const std::string& dim) {
    // A row of a few nearly equal features has a spread far below the default eps's square
    // root, and the layer norm then scales float rounding (of tanh, exp, ... which interpreter
    // and JIT compute differently) by up to 1/sqrt(eps): up to 3e-5 at 1e-5. The default eps
    // only for wide rows of a product (whose features spread as much as they are large); narrow
    // ones, and other expressions, get an eps that keeps the comparison about the code: a wide
    // row of log(sigmoid(sigmoid(d)) + 0.5) spans 0.140-0.151, and its layer norm at the
    // default eps put the engines 6.5e-5 apart (seed 4768, cell 269).
    const bool wide = featureCount(dim) >= 16 && chance(0.5);
    std::string eps = wide && e.text.rfind("linear(", 0) == 0 ? "" : ", eps=0.001";
    int affine = uniform(0, 2);
    // A layer norm divides by the row's spread: bound it by sqrt(F) (all but one feature equal).
    double bound = 6.0;
    if (affine == 0)
      return {fmt::format("layernorm({}{})", e.text, eps), bound};
    std::string w = param("ln_w", dim);
    if (affine == 1)
      return {fmt::format("layernorm({}, {}{})", e.text, w, eps), bound};
    std::string b = param("ln_b", dim);
    return {fmt::format("layernorm({}, {}, {}{})", e.text, w, b, eps), bound + 0.4};
  }

  Expr expression(const std::string& dim, int depth) {
    if (depth == 0 || chance(0.2))
      return leaf(dim);
    Expr a = expression(dim, depth - 1);
    int op = uniform(0, 17);
    // Functions take tensors: a number is only ever an operand of arithmetic.
    while (a.constant && op > 5)
      a = leaf(dim);
    switch (op) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4:
    case 5: { // binary arithmetic
      Expr b = expression(dim, depth - 1);
      while (a.constant && b.constant) // numbers alone fold to a number: a function's bane
        b = leaf(dim);
      static const std::vector<std::string> ops = {"+", "-", "*", "min", "max"};
      const std::string& o = pick(ops);
      if (o == "min" || o == "max")
        return tame({fmt::format("{}({}, {})", o, a.text, b.text), std::max(a.bound, b.bound)});
      double bound = o == "*" ? a.bound * b.bound : a.bound + b.bound;
      return tame({fmt::format("({} {} {})", a.text, o, b.text), bound});
    }
    case 6: { // division by something kept away from zero
      Expr b = expression(dim, depth - 1);
      while (b.constant)
        b = leaf(dim);
      return {fmt::format("{} / ({} + tanh({}))", paren(a), chance(0.5) ? "1.5" : "2", b.text),
              a.bound * 2};
    }
    case 7:
      return {fmt::format("-{}", paren(a)), a.bound, a.constant};
    case 8:
      return {fmt::format("sigmoid({})", a.text), 1.0};
    case 9:
      return {fmt::format("tanh({})", a.text), 1.0};
    case 10:
      return {fmt::format("relu({})", a.text), a.bound};
    case 11:
      if (a.bound > 3)
        a = {fmt::format("tanh({})", a.text), 1.0};
      return {fmt::format("exp({})", a.text), std::exp(a.bound)};
    case 12: // log of something in [0.5, 1.5] or of 1 + exp(small)
      if (chance(0.5))
        return {fmt::format("log(sigmoid({}) + 0.5)", a.text), 0.7};
      return {fmt::format("log(1 + exp(tanh({})))", a.text), 1.4};
    case 13:
      if (chance(0.5))
        return {fmt::format("sqrt(sigmoid({}))", a.text), 1.0};
      return {fmt::format("sqrt({} * {} + 1)", paren(a), paren(a)), a.bound + 1};
    case 14: {
      static const std::vector<std::pair<std::string, double>> ranges = {
          {"-1, 1", 1}, {"0, 0.5", 0.5}, {"-0.25, 2", 2}, {"0.5, 0.5", 0.5}};
      const auto& [range, bound] = pick(ranges);
      return {fmt::format("clamp({}, {})", a.text, range), std::min(a.bound, bound)};
    }
    case 15:
      return {fmt::format("dropout({}, {})", a.text, chance(0.5) ? "0.1" : "0.5"), a.bound};
    case 16:
      return layerNorm(a, dim);
    default: // a product of a value by a parameter vector or a number
      return tame({fmt::format("{} * {}", paren(a), leaf(dim).text), a.bound * 3});
    }
  }

  // An expression that reads a per-step value, so it is [B, dim] (what a temporary, a next state
  // and the argument of a function must be).
  Expr tensorExpression(const std::string& dim, int depth) {
    size_t declared = params_.size();
    Expr e = expression(dim, depth);
    while (!readsPerStepValue(e.text)) {
      params_.resize(declared); // a parameter declared and never used is an error
      e = expression(dim, depth);
    }
    return e;
  }

  bool readsPerStepValue(const std::string& text) const {
    std::string word;
    for (size_t i = 0; i <= text.size(); ++i) {
      char ch = i < text.size() ? text[i] : ' ';
      if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.') {
        word += ch;
        continue;
      }
      for (const Value& v : pool_)
        if (v.name == word)
          return true;
      word.clear();
    }
    return false;
  }

  static std::string paren(const Expr& e) {
    bool simple = std::all_of(e.text.begin(), e.text.end(),
                              [](char c) { return std::isalnum(c) || c == '_' || c == '.'; });
    return simple || (e.text.front() == '(' && e.text.back() == ')') ? e.text : "(" + e.text + ")";
  }

  void emitTemporaries() {
    int count = uniform(0, 4);
    for (int i = 0; i < count; ++i) {
      std::string dim = pick(pool_).dim;
      Expr e = tensorExpression(dim, uniform(1, 3));
      std::string name = fresh("t");
      line(fmt::format("{} = {}", name, e.text));
      pool_.push_back({name, dim, e.bound});
    }
  }

  // Products of values computed in the step (lstm_proj's W_hr, a minimal gated unit's u_h).
  void emitProjectionsOfTemporaries() {
    if (!chance(0.35))
      return;
    std::vector<Value> temps;
    for (const Value& v : pool_)
      if (v.name[0] == 't' || v.name[0] == 'g')
        temps.push_back(v);
    if (temps.empty())
      return;
    Value source = pick(temps);
    if (source.bound > 5) {
      std::string named = fresh("t");
      line(fmt::format("{} = tanh({})", named, source.name));
      source = {named, source.dim, 1.0};
    }
    std::string dim = pick(stateDims());
    int k = uniform(1, 2);
    chunkInto(projection(source, dim, k, chance(0.3)), dim, k);
  }

  // --- the next states and the output ---
  Expr bounded(const std::string& dim) {
    Expr e = tensorExpression(dim, uniform(1, 3));
    static const std::vector<std::string> wraps = {"tanh", "sigmoid", "clamp"};
    const std::string& w = pick(wraps);
    if (w == "clamp")
      return {fmt::format("clamp({}, -2, 2)", e.text), 2};
    return {fmt::format("{}({})", w, e.text), 1};
  }

  void emitStateUpdates() {
    std::vector<std::string> returns;
    std::vector<Value> nextStates;
    for (const Value& s : states_) {
      std::string next = s.name + "_next";
      int form = uniform(0, 4);
      std::string text;
      if (form == 4) { // a value read raw as the next state: a chunk, a temporary, an input
        std::vector<Value> tame;
        for (const Value& v : valuesOf(s.dim))
          if (v.bound <= 4 && v.name != s.name)
            tame.push_back(v);
        if (!tame.empty()) {
          returns.push_back(fmt::format("{} = {}", s.name, pick(tame).name));
          nextStates.push_back({returns.back().substr(returns.back().find("= ") + 2), s.dim, 4});
          continue;
        }
        form = 0;
      }
      if (form == 0) {
        text = bounded(s.dim).text;
      } else if (form == 1) { // a convex combination, as a GRU's
        std::string z = fresh("z");
        line(fmt::format("{} = sigmoid({})", z, tensorExpression(s.dim, 2).text));
        text = fmt::format("{} * {} + (1 - {}) * {}", z, s.name, z, bounded(s.dim).text);
      } else if (form == 2) { // forget and input gates, as an LSTM's cell
        text = fmt::format("sigmoid({}) * {} + sigmoid({}) * {}", tensorExpression(s.dim, 1).text,
                           s.name, tensorExpression(s.dim, 1).text, bounded(s.dim).text);
      } else { // a gate of a value read raw: chunks and states as they are
        std::vector<Value> values = valuesOf(s.dim);
        text = fmt::format("tanh({}) * {}", pick(values).name, bounded(s.dim).text);
      }
      line(fmt::format("{} = {}", next, text));
      returns.push_back(fmt::format("{} = {}", s.name, next));
      nextStates.push_back({next, s.dim, 2});
    }
    // The output: usually a next state, else a temporary, a chunk or the state entering the step.
    std::string output;
    int kind = uniform(0, 9);
    if (kind < 6) {
      output = pick(nextStates).name;
    } else if (kind < 9) {
      std::vector<Value> computed;
      for (const Value& v : pool_)
        if ((v.name[0] == 't' || v.name[0] == 'g') && v.dim.find('+') == std::string::npos)
          computed.push_back(v);
      output = computed.empty() ? nextStates[0].name : pick(computed).name;
    } else {
      output = pick(states_).name;
    }
    lines_.push_back(fmt::format("  return {}; output {}", fmt::join(returns, ", "), output));
  }

  GeneratedCell finish() {
    std::string src = fmt::format("cell fuzz({}) {{\n", fmt::join(sizeOrder_, ", "));
    std::vector<std::string> in, st;
    for (const Value& v : inputs_)
      in.push_back(fmt::format("{}[{}]", v.name, v.dim));
    for (const Value& v : states_)
      st.push_back(fmt::format("{}[{}]", v.name, v.dim));
    src += fmt::format("  input {}\n  state {}\n", fmt::join(in, ", "), fmt::join(st, ", "));
    for (const std::string& p : params_)
      src += fmt::format("  param {}\n", p);
    for (const std::string& l : lines_)
      src += l + "\n";
    src += "}\n";
    GeneratedCell cell;
    cell.source = src;
    cell.sizes = sizes_;
    return cell;
  }

  std::mt19937_64 rng_;
  int counter_ = 0;
  std::map<std::string, int64_t> sizes_;
  std::vector<std::string> sizeOrder_;
  std::vector<Value> inputs_, states_, pool_;
  std::set<std::string> usedInputs_;
  std::vector<std::string> params_;
  std::vector<std::string> lines_;
};

} // namespace

GeneratedCell generateCell(uint64_t seed) {
  return Generator(seed).run();
}

} // namespace rnnc::fuzz
