// Binding a cell to concrete tensors: finding each parameter in a weights file under PyTorch's
// state_dict names, and inferring the cell's named sizes (and the batch B) from the shapes seen.
#pragma once

#include "ir/Cell.h"
#include "runtime/data/SafeTensors.h"

#include <string>
#include <vector>

namespace rnnc {

// A shape observed for one of the cell's values, with a description for error messages
// ("tensor 'weight_hh_l0' in w.safetensors").
struct ShapeObservation {
  const ir::Value* value = nullptr;
  TensorShape actual; // for inputs and states the per-step shape [B, F]
  std::string what;
  // Leading dimensions of the user's tensor that are not part of the value's shape, named and
  // with their size, so that errors show the whole tensor: {"T", 100} for an input [T, B, F],
  // {"1", 1} for an initial state [1, B, F].
  std::vector<std::pair<std::string, int64_t>> leading = {};
};

// Solves the cell's sizes (and B) from the observations, starting from `given` (e.g. --size).
// Throws UserError naming the tensor, its expected (symbolic and numeric) and actual shape when
// an observation contradicts the others, and naming the sizes that cannot be inferred.
ir::SizeMap inferSizes(const ir::Cell& cell, const std::vector<ShapeObservation>& observations,
                       const ir::SizeMap& given = {});

// Every named size of `cell` for one run: those already bound in the cell, then `given`
// (--size), then what `observations` imply, with B = `batch`. Throws UserError for a size that
// nothing determines. B is not in the result.
ir::SizeMap solveCellSizes(const ir::Cell& cell, const std::vector<ShapeObservation>& observations,
                           const ir::SizeMap& given, int64_t batch);

// The tensors of `weights` whose names start with `prefix`, under the rest of their names: a
// submodule's state_dict (rnn.weight_ih_l0 -> weight_ih_l0) out of a whole model's. The names
// left out go to `ignored` (when given); none with the prefix is a UserError listing the names.
TensorMap selectPrefixed(const TensorMap& weights, const std::string& prefix,
                         const std::string& source, std::vector<std::string>* ignored = nullptr);

// The tensor name that holds parameter `param` for a layer and direction: the exact name if the
// file has it, else PyTorch's `NAME_l{layer}` (`NAME_l{layer}_reverse`).
std::string findParameterName(const TensorMap& weights, const std::string& param, int layer,
                              bool reverse);

// How many layers and directions a weights file holds, from its PyTorch state_dict names
// (weight_ih_l2, bias_hh_l0_reverse, ...); plain parameter names are one layer, one direction.
// Throws UserError for a tensor that is no parameter of the cell.
struct WeightLayout {
  int numLayers = 0;
  bool bidirectional = false;
};
WeightLayout inferWeightLayout(const ir::Cell& cell, const TensorMap& weights,
                               const std::string& source);

// The parameters of `cell` for one layer and direction, in the cell's order. Throws UserError
// for a missing tensor, listing what the file has; except for a bias of a file that holds no
// bias at all (torch.nn.LSTM(bias=False) and the like: see isBiasFree), whose tensor pointer is
// null: the bias is zero, of the shape the cell gives it once its sizes are known.
std::vector<std::pair<std::string, const Tensor*>>
collectParameters(const ir::Cell& cell, const TensorMap& weights, const std::string& source,
                  int layer = 0, bool reverse = false);

// Whether a parameter is a bias (a vector whose name starts with "bias", as PyTorch names them:
// bias_ih, bias_hh), and whether a weights file holds no bias of any layer: what PyTorch writes
// for a module built with bias=False.
bool isBias(const ir::Value* param);
bool isBiasFree(const TensorMap& weights);

} // namespace rnnc
