// The compiled half of the Python module (`rnnc._rnnc`): a layer program built from a cell and
// numpy weights, run on numpy arrays with the GIL released. It only converts: every check,
// size inference and error message is the runtime's (runtime/layers/LayerRunner.h), and everything
// torch-shaped (modules, PackedSequence, torch tensors) is the Python half, rnnc/__init__.py.
#include "codegen/WeightType.h"
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "ir/Printer.h"
#include "passes/Autodiff.h"
#include "passes/PassManager.h"
#include "passes/TrainingDropout.h"
#include "runtime/data/AlignedBuffer.h"
#include "runtime/data/SafeTensors.h"
#include "runtime/data/WeightFile.h"
#include "runtime/data/WeightLayouts.h"
#include "runtime/exec/CellBuild.h"
#include "runtime/exec/Hash.h"
#include "runtime/layers/DirectionRun.h"
#include "runtime/layers/Gradients.h"
#include "runtime/layers/LayerRunner.h"

#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>

namespace py = pybind11;

namespace rnnc::python {
namespace {

// float32 in C order: numpy converts anything else (float64, strided views) with a copy.
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using IndexArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

Tensor toTensor(const FloatArray& a) {
  TensorShape shape(a.shape(), a.shape() + a.ndim());
  Tensor t = Tensor::uninitialized(std::move(shape)); // written whole below
  std::memcpy(t.data(), a.data(), static_cast<size_t>(t.numel()) * sizeof(float));
  return t;
}

// The tensor's storage handed to numpy (no copy): the array keeps the tensor alive.
py::array toArray(Tensor&& t) {
  auto* owned = new Tensor(std::move(t));
  py::capsule free(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array_t<float>(owned->shape(), owned->data(), free);
}

// A built-in name, a .cell or .rnnir path, or the cell's source text (anything with a brace).
std::unique_ptr<ir::Cell> loadCell(const std::string& cell) {
  if (cell.find('{') != std::string::npos)
    return frontend::parseCell(cell, "<cell source>");
  return frontend::loadCell(cell);
}

TensorMap toTensors(const std::map<std::string, FloatArray>& arrays) {
  TensorMap tensors;
  for (const auto& [name, array] : arrays)
    tensors[name] = toTensor(array);
  return tensors;
}

// Whether `weights` (by name) hold, bit for bit, every weight `program` was built from (its
// layers' own copies): rnnc.nn's modules keep a program while their parameters do, checked at
// every call (a loop stepping a cell pays it per step), by memcmp, which sees writes torch's
// version counter misses (through `p.data`) and takes a NaN for itself. No copy of the weights
// is kept for it besides the program's.
bool sameWeights(const LayerProgram& program, const std::map<std::string, py::buffer>& weights) {
  std::vector<std::pair<py::buffer_info, const Tensor*>> pairs;
  for (const LayerProgram::Slot& slot : program.slots())
    for (size_t p = 0; p < slot.params.size(); ++p) {
      if (!slot.inWeights[p])
        continue;
      auto it = weights.find(slot.paramNames[p]);
      if (it == weights.end())
        return false;
      py::buffer_info info = it->second.request();
      const Tensor& kept = slot.params[p];
      if (info.format != py::format_descriptor<float>::format() ||
          TensorShape(info.shape.begin(), info.shape.end()) != kept.shape())
        return false;
      py::ssize_t stride = info.itemsize; // C order only (the module passes contiguous ones)
      for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
        if (info.shape[static_cast<size_t>(d)] > 1 &&
            info.strides[static_cast<size_t>(d)] != stride)
          return false;
        stride *= info.shape[static_cast<size_t>(d)];
      }
      pairs.emplace_back(std::move(info), &kept);
    }
  py::gil_scoped_release unlocked;
  for (const auto& [info, kept] : pairs)
    if (std::memcmp(info.ptr, kept->data(), static_cast<size_t>(kept->numel()) * sizeof(float)))
      return false;
  return true;
}

// What both the inference and the training layer are built from.
struct LayerArgs {
  std::unique_ptr<ir::Cell> cell;
  TensorMap weights;
  LayerOptions options;
};

LayerArgs layerArgs(const std::string& cellSpec, const std::map<std::string, FloatArray>& weights,
                    const std::map<std::string, int64_t>& sizes, std::optional<int> numLayers,
                    std::optional<bool> bidirectional, bool batchFirst, bool jit, int threads,
                    const std::string& targetCpu, bool fuse = true,
                    const std::string& weightsDtype = "fp32", const std::string& device = "cpu") {
  LayerArgs args;
  args.weights = toTensors(weights);
  // A built-in LSTM with weight_hr_l0 is torch's projected LSTM.
  const bool builtin = frontend::builtinCellSource(cellSpec).has_value();
  args.cell = loadCell(builtin ? projectedCell(cellSpec, holdsProjection(args.weights)) : cellSpec);
  if (threads < 0)
    throw UserError("threads must be 0 (automatic) or positive, not " + std::to_string(threads));
  LayerOptions& options = args.options;
  options.numLayers = numLayers;
  options.bidirectional = bidirectional;
  options.batchFirst = batchFirst;
  options.engine = engineFor(device, !jit, "device", "jit=False");
  options.threads = threads;
  options.compile.targetCpu = targetCpu;
  options.compile.pipeline.fuse = fuse;
  options.compile.weights = codegen::parseWeightType(weightsDtype);
  options.sizes = {sizes.begin(), sizes.end()};
  return args;
}

// The arguments of a forward call as the runtime's tensors.
struct ForwardArgs {
  Tensor input;
  std::map<std::string, Tensor> states, sideInputs;
  std::optional<Int64Array> lengths;
};

ForwardArgs forwardArgs(const FloatArray& input, const std::map<std::string, FloatArray>& states,
                        const std::optional<IndexArray>& lengths,
                        const std::map<std::string, FloatArray>& sideInputs) {
  if (input.ndim() != 3)
    throw UserError("the input has " + std::to_string(input.ndim()) +
                    " dimensions, expected 3: [T, B, input_size] ([B, T, input_size] with "
                    "batch_first)");
  ForwardArgs args;
  args.input = toTensor(input);
  for (const auto& [name, array] : states)
    args.states[name] = toTensor(array);
  for (const auto& [name, array] : sideInputs)
    args.sideInputs[name] = toTensor(array);
  if (lengths)
    args.lengths =
        Int64Array{TensorShape(lengths->shape(), lengths->shape() + lengths->ndim()),
                   std::vector<int64_t>(lengths->data(), lengths->data() + lengths->size())};
  return args;
}

py::dict toDict(std::map<std::string, Tensor>&& tensors) {
  py::dict out;
  for (auto& [name, tensor] : tensors)
    out[py::str(name)] = toArray(std::move(tensor));
  return out;
}

class Layer {
public:
  Layer(const std::string& cellSpec, const std::map<std::string, FloatArray>& weights,
        const std::map<std::string, int64_t>& sizes, std::optional<int> numLayers,
        std::optional<bool> bidirectional, bool batchFirst, bool jit, int threads,
        const std::string& targetCpu, bool fuse, const std::string& weightsDtype,
        const std::string& device) {
    LayerArgs args = layerArgs(cellSpec, weights, sizes, numLayers, bidirectional, batchFirst, jit,
                               threads, targetCpu, fuse, weightsDtype, device);
    cell_ = std::move(args.cell);
    py::gil_scoped_release unlocked; // compiling takes a while; other Python threads go on
    program_ = LayerProgram::build(*cell_, std::move(args.weights), "the state dict", args.options);
  }

  // (output, {state: final value}) for input [T, B, I] ([B, T, I] batch_first).
  py::tuple forward(const FloatArray& input, const std::map<std::string, FloatArray>& states,
                    const std::optional<IndexArray>& lengths,
                    const std::map<std::string, FloatArray>& sideInputs) const {
    ForwardArgs args = forwardArgs(input, states, lengths, sideInputs);
    LayerResult result;
    {
      py::gil_scoped_release unlocked;
      result = program_->run(args.input, args.states, args.lengths, args.sideInputs);
    }
    return py::make_tuple(toArray(std::move(result.output)), toDict(std::move(result.finalStates)));
  }

  // The seconds of each of `repeats` calls as a C++ caller makes them (the arguments converted,
  // the layer run), timed in C++: what the Python call's overhead is measured against.
  std::vector<double> timeNative(const FloatArray& input,
                                 const std::map<std::string, FloatArray>& states,
                                 int repeats) const {
    std::vector<double> seconds;
    py::gil_scoped_release unlocked;
    for (int r = 0; r < repeats; ++r) {
      auto start = std::chrono::steady_clock::now();
      ForwardArgs args = forwardArgs(input, states, std::nullopt, {});
      LayerResult result = program_->run(args.input, args.states, args.lengths, args.sideInputs);
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return seconds;
  }

  int numLayers() const { return program_->numLayers(); }
  int numDirections() const { return program_->numDirections(); }
  int64_t inputSize() const { return program_->inputSize(); }
  int64_t outputSize() const { return program_->outputSize(); }
  // The first layer's sizes, every one the cell names: those given and those its weights gave.
  ir::SizeMap sizes() const { return program_->slots().front().bound->sizes; }
  std::vector<std::string> stateNames() const {
    std::vector<std::string> names;
    for (const auto& state : program_->cell().states)
      names.push_back(state->name);
    return names;
  }
  int64_t stateSize(const std::string& name) const {
    const ir::Value* value = program_->cell().findArgument(name);
    if (!value || value->argKind != ir::ArgKind::State)
      throw UserError("cell '" + program_->cell().name + "' has no state '" + name + "'");
    return program_->stateSize(name);
  }
  std::vector<std::string> sideInputNames() const { return program_->sideInputNames(); }
  const ir::Cell& boundCell() const { return *program_->slots().at(0).bound; }

  bool sameWeights(const std::map<std::string, py::buffer>& weights) const {
    return python::sameWeights(*program_, weights);
  }

private:
  std::unique_ptr<ir::Cell> cell_;
  std::shared_ptr<const LayerProgram> program_;
};

// What a training forward kept for its backward; opaque to Python.
struct Tape {
  std::shared_ptr<const TrainingTape> tape;
};

// Parameters' gradients summed over several backward calls, in place (a decoder's steps in one
// autograd graph: rnnc/_autograd.py), until take() hands them to Python. The lock keeps two
// backward calls from adding at once (threads releasing the GIL).
class ParameterSums {
public:
  // Every sum by parameter name, as numpy arrays that own them; none are left. An error where
  // a backward failed while adding (the sums would miss its part, or hold half of it).
  py::dict take() {
    TensorMap sums;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (broken_)
        throw UserError("the parameters' gradients summed over this graph's calls are incomplete: "
                        "the backward of one of them failed");
      sums.swap(sums_);
    }
    return toDict(std::move(sums));
  }

private:
  friend class Training;
  std::mutex mutex_;
  TensorMap sums_;
  bool broken_ = false;
};

// A layer for training, built for one set of weights (an optimiser step changes them, and the
// next forward builds anew: the compiled code comes from the memory cache, only the weights are
// packed again). Dropout between layers, when given, and inside the cell are drawn from `seed`;
// `training` false: the cell's dropouts are the identity (a module in eval mode).
class Training {
public:
  Training(const std::string& cellSpec, const std::map<std::string, FloatArray>& weights,
           const std::map<std::string, int64_t>& sizes, std::optional<int> numLayers,
           std::optional<bool> bidirectional, bool batchFirst, bool jit, int threads,
           const std::string& targetCpu, double dropout, uint64_t seed, bool training,
           const std::string& weightsDtype) {
    // weightsDtype bf16 or fp16: mixed precision (the products' weights rounded, the rest fp32).
    LayerArgs args = layerArgs(cellSpec, weights, sizes, numLayers, bidirectional, batchFirst, jit,
                               threads, targetCpu, /*fuse=*/true, weightsDtype);
    weightsDtype_ = codegen::weightTypeName(args.options.compile.weights);
    args.options.training = training;
    args.options.dropout = dropout;
    args.options.seed = seed;
    py::gil_scoped_release unlocked;
    program_ =
        GradientProgram::build(*args.cell, std::move(args.weights), "the parameters", args.options);
  }

  // (output, {state: final value}, tape). Side inputs (a cell's inputs past its first) by name;
  // the backward gives their gradients under those names.
  // `seed`: this call's dropout masks' (None: the one the program was built with).
  py::tuple forward(const FloatArray& input, const std::map<std::string, FloatArray>& states,
                    const std::optional<IndexArray>& lengths,
                    const std::map<std::string, FloatArray>& sideInputs,
                    std::optional<uint64_t> seed) const {
    ForwardArgs args = forwardArgs(input, states, lengths, sideInputs);
    auto tape = std::make_shared<TrainingTape>();
    {
      py::gil_scoped_release unlocked;
      *tape = program_->forward(std::move(args.input), args.states, args.lengths, args.sideInputs,
                                seed);
    }
    // The output is the caller's (the backward reads its shape only); the tape keeps the final
    // states, whose gradients it checks.
    Tensor output = std::move(tape->forward.output);
    return py::make_tuple(toArray(std::move(output)),
                          toDict(std::map<std::string, Tensor>(tape->forward.finalStates)),
                          Tape{tape});
  }

  // Every gradient by name (parameters as in the weights, "input", "h0", "c0" or the state's
  // name) for loss = sum(output * grad_output) + sum(final state * its gradient).
  // With `sums`, the parameters' gradients are added into it instead of returned.
  py::dict backward(const Tape& tape, const std::optional<FloatArray>& gradOutput,
                    const std::map<std::string, FloatArray>& gradFinals,
                    ParameterSums* sums) const {
    if (!tape.tape)
      throw UserError("backward needs the tape of a training forward");
    GradientInputs grads;
    if (gradOutput)
      grads.output = toTensor(*gradOutput);
    for (const auto& [name, array] : gradFinals)
      grads.finalStates[name] = toTensor(array);
    TensorMap result;
    {
      py::gil_scoped_release unlocked;
      if (sums) {
        std::lock_guard<std::mutex> lock(sums->mutex_);
        try {
          result = program_->backward(*tape.tape, grads, sums->sums_);
        } catch (...) {
          sums->broken_ = true;
          throw;
        }
      } else {
        result = program_->backward(*tape.tape, grads);
      }
    }
    return toDict(std::move(result));
  }

  bool sameWeights(const std::map<std::string, py::buffer>& weights) const {
    return python::sameWeights(program_->layers(), weights);
  }
  bool drawsMasksAtBuild() const { return program_->drawsMasksAtBuild(); }
  // "fp32", or "bf16"/"fp16" for mixed precision.
  const std::string& weightsDtype() const { return weightsDtype_; }

private:
  std::shared_ptr<const GradientProgram> program_;
  std::string weightsDtype_;
};

// The IR of `cell` (sizes bound) through the pipeline: after every pass ("all"), after the named
// pass, or the optimised result (None).
std::string pipelineIR(const ir::Cell& cell, const std::optional<std::string>& after) {
  passes::PipelineOptions options;
  std::ostringstream log;
  if (after && *after == "all") {
    options.printAfterAll = true;
  } else if (after) {
    passes::checkPassName(*after, "after");
    options.printAfter.insert(*after);
  }
  std::shared_ptr<ir::Cell> optimised = optimiseCell(cell, options, &log);
  if (!after)
    return ir::toString(*optimised);
  return log.str();
}

} // namespace
} // namespace rnnc::python

PYBIND11_MODULE(_rnnc, m) {
  using namespace rnnc;
  using namespace rnnc::python;
  m.doc() = "rnnc's compiled layer programs (use the rnnc package, not this module)";
  // Bad input is the caller's: ValueError with the runtime's message (tensor, both shapes).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p)
        std::rethrow_exception(p);
    } catch (const UserError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.attr("__version__") = RNNC_VERSION;
  m.def("builtin_cells", &frontend::builtinCellNames);
  // The memory kept for reuse (runtime/data/AlignedBuffer.h; rnnc.empty_cache and the rest).
  m.def("memory_cached", &cachedLargeBufferBytes);
  m.def("empty_cache", &releaseCachedLargeBuffers);
  m.def("memory_cache_limit", &cachedLargeBufferLimit);
  m.def(
      "set_memory_cache_limit",
      [](int64_t bytes) {
        if (bytes < 0)
          throw UserError("set_memory_cache_limit: the limit must be 0 (keep none) or more bytes, "
                          "got " +
                          std::to_string(bytes));
        return setCachedLargeBufferLimit(static_cast<size_t>(bytes));
      },
      py::arg("bytes"));
  m.def(
      "read_safetensors", [](const std::string& path) { return toDict(readSafeTensors(path)); },
      py::arg("path"));
  m.def(
      "read_weight_file", [](const std::string& path) { return toDict(readWeightFile(path)); },
      py::arg("path"));
  m.def(
      "cell_params",
      [](const std::string& cell, const std::map<std::string, int64_t>& sizes) {
        auto parsed = python::loadCell(cell);
        parsed->bindSizes({sizes.begin(), sizes.end()});
        py::dict shapes;
        for (const auto& param : parsed->params) {
          std::vector<int64_t> shape;
          for (const ir::Dim& d : param->shape) {
            if (!d.isConstant())
              throw UserError("cell '" + parsed->name + "': parameter '" + param->name +
                              "' has size " + d.str() + "; give every size it depends on");
            shape.push_back(d.constantValue());
          }
          shapes[py::str(param->name)] = py::tuple(py::cast(shape));
        }
        return shapes;
      },
      py::arg("cell"), py::arg("sizes"));
  // A cell's arguments with `sizes` bound, for a module that makes its parameters: the inputs'
  // names, each state's width and the output's, by name.
  m.def(
      "cell_signature",
      [](const std::string& cell, const std::map<std::string, int64_t>& sizes) {
        auto parsed = python::loadCell(cell);
        // The size that is the first input's width, where one is (input_size in the built-in
        // cells): the layers past the first bind it to the width of the layer below.
        const ir::Dim& inputWidth = parsed->inputs.at(0)->shape.back();
        std::optional<std::string> inputSize;
        if (inputWidth.terms().size() == 1 &&
            inputWidth == ir::Dim::symbol(inputWidth.terms().begin()->first))
          inputSize = inputWidth.terms().begin()->first;
        parsed->bindSizes({sizes.begin(), sizes.end()});
        auto width = [&](const ir::Value* value, const std::string& what) {
          const ir::Dim& d = value->shape.back();
          if (!d.isConstant())
            throw UserError("cell '" + parsed->name + "': " + what + " has size " + d.str() +
                            "; give every size it depends on");
          return d.constantValue();
        };
        py::list inputs;
        for (const auto& input : parsed->inputs)
          inputs.append(py::str(input->name));
        py::dict states;
        for (const auto& state : parsed->states)
          states[py::str(state->name)] = width(state.get(), "state '" + state->name + "'");
        py::dict signature;
        signature["inputs"] = inputs;
        signature["states"] = states;
        signature["output"] = width(parsed->output, "the output");
        // The side inputs' widths where the sizes give them (-1 where they do not).
        py::dict sideWidths;
        for (size_t i = 1; i < parsed->inputs.size(); ++i) {
          const ir::Dim& d = parsed->inputs[i]->shape.back();
          sideWidths[py::str(parsed->inputs[i]->name)] = d.isConstant() ? d.constantValue() : -1;
        }
        signature["side_input_widths"] = sideWidths;
        signature["input_size"] = inputSize ? py::object(py::str(*inputSize)) : py::none();
        signature["dropout"] = ir::containsOp(*parsed, ir::Op::Dropout); // masks in training
        return signature;
      },
      py::arg("cell"), py::arg("sizes"));
  m.def(
      "parsed_cell_ir",
      // The cell as parsed, its sizes bound, before any pass (rnnc compile CELL --emit ir):
      // what rnnc.nn evaluates in torch's operations for a second derivative.
      [](const std::string& cell, const std::map<std::string, int64_t>& sizes) {
        std::shared_ptr<ir::Cell> parsed = python::loadCell(cell);
        if (!sizes.empty())
          parsed->bindSizes({sizes.begin(), sizes.end()});
        return ir::toString(*parsed);
      },
      py::arg("cell"), py::arg("sizes"));
  m.def(
      "dropout_mask",
      // A cell's dropout masks as a training run draws them (runtime/exec/Hash.h): for each
      // mask row in `rows` (any shape), `columns` values of dropout `stream` in a run seeded
      // `seed`; a negative row (a step past a sequence's length: nothing drawn) is all ones.
      // What rnnc.nn replays in torch's operations for a second derivative through dropout.
      [](uint64_t seed, uint64_t stream, const IndexArray& rows, int64_t columns, double p) {
        if (columns < 0 || !(p >= 0 && p < 1))
          throw py::value_error(fmt::format("a dropout mask needs columns >= 0 and p in [0, 1), "
                                            "not {} and {}",
                                            columns, p));
        TensorShape shape(rows.shape(), rows.shape() + rows.ndim());
        shape.push_back(columns);
        Tensor mask(std::move(shape), 1.0f);
        const int64_t* row = rows.data();
        for (py::ssize_t r = 0; r < rows.size(); ++r)
          if (row[r] >= 0)
            fillDropoutMaskRow(seed, stream, static_cast<uint64_t>(row[r]), p,
                               mask.data() + r * columns, columns);
        return toArray(std::move(mask));
      },
      py::arg("seed"), py::arg("stream"), py::arg("rows"), py::arg("columns"), py::arg("p"));
  m.def(
      "between_layers_mask",
      // The mask of the dropout between layer `layer` and the next, over that layer's output
      // [T, B, W] (time-major, padded), as a training run draws it.
      [](int64_t steps, int64_t batch, int64_t width, double p, uint64_t seed, int layer) {
        if (steps < 0 || batch < 0 || width < 0 || !(p >= 0 && p < 1))
          throw py::value_error(fmt::format("a dropout mask needs [T, B, W] >= 0 and p in [0, 1), "
                                            "not [{}, {}, {}] and {}",
                                            steps, batch, width, p));
        Tensor mask({steps, batch, width}, 1.0f);
        dropoutBetweenLayers(mask, p, seed, layer);
        return toArray(std::move(mask));
      },
      py::arg("steps"), py::arg("batch"), py::arg("width"), py::arg("p"), py::arg("seed"),
      py::arg("layer"));
  m.def(
      "cell_ir",
      // grad: the backward step a training run derives (rnnc compile CELL --train --grad).
      [](const std::string& cell, const std::map<std::string, int64_t>& sizes,
         const std::optional<std::string>& after, bool grad) {
        std::shared_ptr<ir::Cell> parsed = python::loadCell(cell);
        if (!sizes.empty())
          parsed->bindSizes({sizes.begin(), sizes.end()});
        if (grad) {
          passes::lowerTrainingDropout(*parsed);
          passes::lowerParameterDropout(*parsed);
          parsed = passes::deriveBackward(*parsed).cell;
        }
        return pipelineIR(*parsed, after);
      },
      py::arg("cell"), py::arg("sizes"), py::arg("after"), py::arg("grad") = false);
  py::class_<python::Layer>(m, "Layer")
      .def(py::init<const std::string&, const std::map<std::string, FloatArray>&,
                    const std::map<std::string, int64_t>&, std::optional<int>, std::optional<bool>,
                    bool, bool, int, const std::string&, bool, const std::string&,
                    const std::string&>(),
           py::arg("cell"), py::arg("weights"), py::arg("sizes"), py::arg("num_layers"),
           py::arg("bidirectional"), py::arg("batch_first"), py::arg("jit"), py::arg("threads"),
           py::arg("target_cpu"), py::arg("fuse") = true, py::arg("weights_dtype") = "fp32",
           py::arg("device") = "cpu")
      .def("time_native", &python::Layer::timeNative, py::arg("input"), py::arg("states"),
           py::arg("repeats"))
      .def("forward", &python::Layer::forward, py::arg("input"), py::arg("states"),
           py::arg("lengths"), py::arg("side_inputs"))
      .def_property_readonly("num_layers", &python::Layer::numLayers)
      .def_property_readonly("num_directions", &python::Layer::numDirections)
      .def_property_readonly("input_size", &python::Layer::inputSize)
      .def_property_readonly("output_size", &python::Layer::outputSize)
      .def_property_readonly("sizes", &python::Layer::sizes)
      .def_property_readonly("state_names", &python::Layer::stateNames)
      .def_property_readonly("side_input_names", &python::Layer::sideInputNames)
      .def("state_size", &python::Layer::stateSize)
      .def("same_weights", &python::Layer::sameWeights, py::arg("weights"))
      .def(
          "ir",
          [](const python::Layer& layer, const std::optional<std::string>& after) {
            return pipelineIR(layer.boundCell(), after);
          },
          py::arg("after"));
  py::class_<Tape>(m, "Tape");
  py::class_<ParameterSums>(m, "ParameterSums").def(py::init<>()).def("take", &ParameterSums::take);
  py::class_<Training>(m, "Training")
      .def(py::init<const std::string&, const std::map<std::string, FloatArray>&,
                    const std::map<std::string, int64_t>&, std::optional<int>, std::optional<bool>,
                    bool, bool, int, const std::string&, double, uint64_t, bool,
                    const std::string&>(),
           py::arg("cell"), py::arg("weights"), py::arg("sizes"), py::arg("num_layers"),
           py::arg("bidirectional"), py::arg("batch_first"), py::arg("jit"), py::arg("threads"),
           py::arg("target_cpu"), py::arg("dropout"), py::arg("seed"), py::arg("training") = true,
           py::arg("weights_dtype") = "fp32")
      .def("forward", &Training::forward, py::arg("input"), py::arg("states"), py::arg("lengths"),
           py::arg("side_inputs"), py::arg("seed") = py::none())
      .def_property_readonly("draws_masks_at_build", &Training::drawsMasksAtBuild)
      .def_property_readonly("weights_dtype", &Training::weightsDtype)
      .def("backward", &Training::backward, py::arg("tape"), py::arg("grad_output"),
           py::arg("grad_finals"), py::arg("sums") = nullptr)
      .def("same_weights", &Training::sameWeights, py::arg("weights"));
}
