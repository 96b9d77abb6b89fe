#include "runtime/data/Weights.h"

#include "ir/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>

namespace rnnc {
namespace {

// The declared shape with the leading dimensions, symbolic and (as far as known) numeric.
std::string expectedShape(const ShapeObservation& obs, const ir::SizeMap& sizes) {
  std::string symbolic = "[", numeric = "[";
  for (const auto& [name, value] : obs.leading) {
    symbolic += name + ", ";
    numeric += std::to_string(value) + ", ";
  }
  const ir::Shape& shape = obs.value->shape;
  for (size_t i = 0; i < shape.size(); ++i) {
    auto value = shape[i].evaluate(sizes);
    symbolic += (i ? ", " : "") + shape[i].str();
    numeric += (i ? ", " : "") + (value ? std::to_string(*value) : shape[i].str());
  }
  symbolic += "]";
  numeric += "]";
  return symbolic == numeric ? symbolic : symbolic + " = " + numeric;
}

std::string actualShape(const ShapeObservation& obs) {
  TensorShape full;
  for (const auto& entry : obs.leading)
    full.push_back(entry.second);
  full.insert(full.end(), obs.actual.begin(), obs.actual.end());
  return shapeToString(full);
}

// A state_dict name split into the parameter and PyTorch's `_l{k}` / `_l{k}_reverse` suffix.
struct LayerName {
  std::string base;
  int layer = 0;
  bool reverse = false;
};

std::optional<LayerName> parseLayerName(std::string_view key) {
  LayerName name;
  if (key.ends_with("_reverse")) {
    name.reverse = true;
    key.remove_suffix(8);
  }
  size_t digits = key.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(key[digits - 1])))
    --digits;
  if (digits == key.size() || key.size() - digits > 6 || digits < 2 ||
      key.substr(digits - 2, 2) != "_l")
    return std::nullopt;
  name.layer = std::stoi(std::string(key.substr(digits)));
  name.base = std::string(key.substr(0, digits - 2));
  return name;
}

struct Pending {
  const ShapeObservation* obs;
  size_t dim;
};

} // namespace

ir::SizeMap inferSizes(const ir::Cell& cell, const std::vector<ShapeObservation>& observations,
                       const ir::SizeMap& given) {
  ir::SizeMap sizes = given;
  std::map<std::string, std::string> source; // which tensor fixed each size
  for (const auto& [name, value] : given)
    source[name] = name == ir::kBatchSymbol ? "the inputs" : "--size " + name;
  std::vector<Pending> pending;
  for (const ShapeObservation& obs : observations) {
    const ir::Shape& declared = obs.value->shape;
    if (declared.size() != obs.actual.size())
      throw UserError(fmt::format("{} has shape {}, expected {} (rank {})", obs.what,
                                  actualShape(obs), expectedShape(obs, {}),
                                  declared.size() + obs.leading.size()));
    for (size_t d = 0; d < declared.size(); ++d)
      pending.push_back({&obs, d});
  }

  // Explains a contradiction: both shapes, and where each size involved in a wrong dimension
  // was fixed.
  auto mismatch = [&](const ShapeObservation& obs) -> UserError {
    std::string reasons;
    std::set<std::string> explained;
    for (size_t d = 0; d < obs.value->shape.size(); ++d) {
      const ir::Dim& dim = obs.value->shape[d];
      if (dim.evaluate(sizes) == obs.actual[d])
        continue;
      for (const auto& [name, coeff] : dim.terms())
        if (sizes.count(name) && explained.insert(name).second)
          reasons += fmt::format("; {} = {} from {}", name, sizes.at(name), source[name]);
    }
    return UserError(fmt::format("{} has shape {}, expected {}{}", obs.what, actualShape(obs),
                                 expectedShape(obs, sizes), reasons));
  };

  bool progress = true;
  while (progress && !pending.empty()) {
    progress = false;
    for (auto it = pending.begin(); it != pending.end();) {
      const ShapeObservation& obs = *it->obs;
      ir::Dim dim = obs.value->shape[it->dim].substitute(sizes);
      int64_t actual = obs.actual[it->dim];
      if (dim.isConstant()) {
        if (dim.constantValue() != actual)
          throw mismatch(obs);
      } else if (dim.terms().size() == 1) {
        const auto& [name, coeff] = *dim.terms().begin();
        int64_t rest = actual - dim.offset();
        if (rest % coeff != 0 || rest / coeff < 1)
          throw mismatch(obs);
        sizes[name] = rest / coeff;
        source[name] = obs.what;
      } else {
        ++it;
        continue;
      }
      it = pending.erase(it);
      progress = true;
    }
  }
  if (!pending.empty()) {
    // The first unsolved dimension names the sizes that are missing. (Keep the Dim alive: its
    // terms are iterated.)
    const ir::Dim unsolved =
        pending.front().obs->value->shape[pending.front().dim].substitute(sizes);
    std::string unknown;
    for (const auto& [name, coeff] : unsolved.terms())
      unknown += (unknown.empty() ? "" : ", ") + name;
    throw UserError(fmt::format("cannot infer the sizes {} of cell '{}' from the shapes given; "
                                "pass them with --size NAME=VALUE",
                                unknown, cell.name));
  }
  return sizes;
}

ir::SizeMap solveCellSizes(const ir::Cell& cell, const std::vector<ShapeObservation>& observations,
                           const ir::SizeMap& given, int64_t batch) {
  ir::SizeMap known = cell.sizes; // a cell may come with sizes bound already
  known.insert(given.begin(), given.end());
  known[ir::kBatchSymbol] = batch;
  ir::SizeMap sizes = inferSizes(cell, observations, known);
  sizes.erase(ir::kBatchSymbol);
  for (const auto& name : cell.sizeNames)
    if (!sizes.count(name))
      throw UserError(fmt::format("size '{}' of cell '{}' appears in no tensor given; pass it "
                                  "with --size {}=VALUE",
                                  name, cell.name, name));
  return sizes;
}

std::string findParameterName(const TensorMap& weights, const std::string& param, int layer,
                              bool reverse) {
  std::string suffixed = fmt::format("{}_l{}{}", param, layer, reverse ? "_reverse" : "");
  if (layer == 0 && !reverse && weights.count(param))
    return param;
  return suffixed;
}

// Where the file's names include a parameter's under a module's prefix ("model.rnn.weight_ih_l0":
// a layer in a whole model's state_dict or a checkpoint), the option that selects it.
static std::string prefixHint(const ir::Cell& cell, const TensorMap& weights) {
  for (const auto& [key, tensor] : weights)
    for (size_t dot = key.rfind('.'); dot != std::string::npos && dot > 0;
         dot = key.rfind('.', dot - 1)) {
      auto name = parseLayerName(key.substr(dot + 1));
      const ir::Value* param = name ? cell.findArgument(name->base) : nullptr;
      if (param && param->argKind == ir::ArgKind::Param)
        return fmt::format("; the file holds a larger model: select the layer's tensors with "
                           "--weights-prefix {} (LayerSpec::weightsPrefix)",
                           key.substr(0, dot + 1));
    }
  return "";
}

WeightLayout inferWeightLayout(const ir::Cell& cell, const TensorMap& weights,
                               const std::string& source) {
  WeightLayout layout;
  std::string params;
  for (const auto& p : cell.params)
    params += (params.empty() ? "" : ", ") + p->name;
  for (const auto& [key, tensor] : weights) {
    if (cell.findArgument(key)) {
      layout.numLayers = std::max(layout.numLayers, 1);
      continue;
    }
    auto name = parseLayerName(key);
    const ir::Value* param = name ? cell.findArgument(name->base) : nullptr;
    if (!param || param->argKind != ir::ArgKind::Param)
      throw UserError(fmt::format("{}: tensor '{}' is not a parameter of cell '{}' (its "
                                  "parameters, optionally with PyTorch's _l<k> and _reverse "
                                  "suffixes: {}){}",
                                  source, key, cell.name, params, prefixHint(cell, weights)));
    layout.numLayers = std::max(layout.numLayers, name->layer + 1);
    layout.bidirectional |= name->reverse;
  }
  if (layout.numLayers == 0 && !cell.params.empty())
    throw UserError(source + ": holds no parameters of cell '" + cell.name + "' (" + params + ")");
  layout.numLayers = std::max(layout.numLayers, 1); // a cell without parameters: one layer
  return layout;
}

std::vector<std::pair<std::string, const Tensor*>> collectParameters(const ir::Cell& cell,
                                                                     const TensorMap& weights,
                                                                     const std::string& source,
                                                                     int layer, bool reverse) {
  std::vector<std::pair<std::string, const Tensor*>> found;
  for (const auto& param : cell.params) {
    std::string name = findParameterName(weights, param->name, layer, reverse);
    auto it = weights.find(name);
    if (it == weights.end() && isBias(param.get()) && isBiasFree(weights)) {
      found.emplace_back(name, nullptr); // bias=False: zero
      continue;
    }
    if (it == weights.end()) {
      std::string have;
      for (const auto& [key, tensor] : weights)
        have += (have.empty() ? "" : ", ") + key;
      std::string alternatives =
          layer == 0 && !reverse ? "'" + param->name + "' and '" + name + "'" : "'" + name + "'";
      throw UserError(fmt::format("{}: no tensor for parameter '{}' of cell '{}' (looked for "
                                  "{}); the file has: {}",
                                  source, param->name, cell.name, alternatives,
                                  have.empty() ? "nothing" : have));
    }
    found.emplace_back(name, &it->second);
  }
  return found;
}

bool isBias(const ir::Value* param) {
  return param->argKind == ir::ArgKind::Param && param->shape.size() == 1 &&
         param->name.rfind("bias", 0) == 0;
}

bool isBiasFree(const TensorMap& weights) {
  return std::none_of(weights.begin(), weights.end(), [](const auto& entry) {
    auto name = parseLayerName(entry.first);
    return (name ? name->base : entry.first).rfind("bias", 0) == 0;
  });
}

TensorMap selectPrefixed(const TensorMap& weights, const std::string& prefix,
                         const std::string& source, std::vector<std::string>* ignored) {
  TensorMap selected;
  for (const auto& [key, tensor] : weights)
    if (key.rfind(prefix, 0) == 0 && key.size() > prefix.size())
      selected[key.substr(prefix.size())] = tensor;
    else if (ignored)
      ignored->push_back(key);
  if (selected.empty()) {
    std::string have;
    for (const auto& [key, tensor] : weights)
      have += (have.empty() ? "" : ", ") + key;
    throw UserError(fmt::format("{}: no tensor's name starts with the weights prefix '{}'; the "
                                "file has: {}",
                                source, prefix, have.empty() ? "nothing" : have));
  }
  return selected;
}

} // namespace rnnc
