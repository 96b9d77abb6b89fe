// rnnc's C++ API: build an RNN layer from a cell and PyTorch weights once, then run forward
// passes on your own buffers. A Layer is immutable after construction and forward() is safe to
// call from several threads at once. Errors are thrown as std::runtime_error (std::logic_error
// for a bug in rnnc) with a message naming the tensor and its expected and actual shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rnnc {

struct LayerSpec {
  std::string cell = "lstm";         // a built-in cell name or the path of a .cell file
  std::optional<int> numLayers;      // checked against the weights; inferred when absent
  std::optional<bool> bidirectional; // likewise
  bool batchFirst = false;           // input and output are [B, T, F]
  bool jit = true;                   // false: the reference interpreter
  // Where the JIT's code runs: "cpu", "cuda" (an NVIDIA GPU through the CUDA driver, loaded at
  // run time; an error without one) or "cuda-emulated" (the GPU's kernels run on this CPU, GPU
  // thread after GPU thread: slow, for checking them without a GPU). Inference only.
  std::string device = "cpu";
  int threads = 0; // threads per forward call, each time step split between them; 0: automatic
                   // (every core, fewer while other processes keep cores busy, one for a call
                   // too short to pay for starting threads)
  std::map<std::string, int64_t> sizes; // sizes the weights do not determine
  // Generate the JIT code for this x86-64 CPU (LLVM's name: "haswell" for AVX2,
  // "skylake-avx512", "znver4"...) instead of the host's, e.g. to measure the AVX2 kernels on an
  // AVX-512 machine; it must run here (an error names the missing extension). Empty: the host.
  std::string targetCpu;
  // How the JIT stores the weights of every matrix product: "fp32" (as given); "fp16": half the
  // bytes, rounded to nearest even once when the layer is built and widened to fp32 in registers
  // (the math stays fp32); "bf16": half the bytes, and each product multiplies bf16-rounded
  // inputs by them, summed in fp32 (vdpbf16ps where the CPU has AVX512_BF16: about 2x fp32);
  // "int8": dynamic quantization. Errors within 1e-2 of the output's range. With jit = false
  // the interpreter computes its products alike. forwardTraining()/backward() take "bf16" and
  // "fp16" (mixed precision: the products read the rounded weights, and with bf16 the
  // gradients' products take bf16 operands too; everything else fp32), not "int8".
  std::string weightsDtype = "fp32";
  // Take the tensors whose names start with this prefix ("rnn." for a model's self.rnn) under
  // the rest of their names, ignoring the others: a submodule out of a whole model's state_dict.
  std::string weightsPrefix;
};

// A named float32 tensor in C order, for weights given from memory.
struct WeightTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// What a training forward kept for its backward: the states entering every step of every layer
// and direction, and the inputs each read (the training workspace). Opaque; cheap to copy.
class TrainingRecord {
public:
  int64_t workspaceBytes() const;
  struct Impl;

private:
  friend class Layer;
  std::shared_ptr<const Impl> impl_;
};

// The parameters' gradients of several backward() calls summed in place, by parameter name: a
// decoder trained step by step makes a forwardTraining() and a backward() per step, and passing
// one GradientSums to each backward() adds every step's weight gradients into it inside the
// products that form them, rather than returning (and allocating) a map of full gradients per
// step for the caller to add up. Layers sharing one must have the same parameters' shapes.
class GradientSums {
public:
  GradientSums();
  // The sums (as backward() names the gradients), handed over: none are left, and the next
  // backward() starts from zero.
  std::map<std::string, WeightTensor> take();
  bool empty() const;
  struct Impl;

private:
  friend class Layer;
  std::shared_ptr<Impl> impl_;
};

// Every buffer of a call by name, for any cell (states other than h and c, side inputs):
// caller-owned float32 (lengths int64) in C order, laid out as for Layer::forward() ([B, T, ...]
// sequences with batchFirst).
struct SequenceBuffers {
  const float* input = nullptr;                      // [T, B, inputSize()]
  std::map<std::string, const float*> sideInputs;    // [T, B, sideInputSize(name)], each of them
  std::map<std::string, const float*> initialStates; // [L*D, B, stateSize(name)]; absent: zeros
  const int64_t* lengths = nullptr;                  // [B], each in [1, T]; null: all T steps
  float* output = nullptr;                           // [T, B, outputSize()], zero past lengths
  std::map<std::string, float*> finalStates;         // [L*D, B, stateSize(name)]; absent: unwritten
};

class Layer {
public:
  // Weights from a file with PyTorch state_dict names (weight_ih_l0, ...): safetensors, or
  // torch.save's archive of a state_dict (float32, float64, float16 or bfloat16 tensors).
  static Layer fromFile(const LayerSpec& spec, const std::string& weightsPath);
  // Weights from memory, under the same names.
  static Layer fromWeights(const LayerSpec& spec,
                           const std::map<std::string, WeightTensor>& weights);

  int numLayers() const;
  int numDirections() const;
  int64_t inputSize() const;
  int64_t outputSize() const; // num_directions * hidden (or proj) size: output features
  // The features of one slot of a state ("h", "c", ...), as in h0 [L*D, B, stateSize].
  int64_t stateSize(const std::string& state) const;
  std::vector<std::string> stateNames() const; // in the cell's order: "h", "c" for an LSTM
  // A cell with several inputs (`input x[...], y[...]`) reads its first as the layer's input and
  // the others as side inputs: sequences every layer and direction reads at the same step.
  std::vector<std::string> sideInputNames() const; // in the cell's order; empty for one input
  int64_t sideInputSize(const std::string& name) const;

  // Runs a batch. All pointers are caller-owned float32 (lengths int64) buffers in C order:
  //   input   [T, B, inputSize()]              ([B, T, ...] with batchFirst)
  //   output  [T, B, outputSize()]             ([B, T, ...] with batchFirst), zero past lengths
  //   h0, c0  [L*D, B, stateSize("h"/"c")]     or null for zeros (c0 only for cells with c)
  //   hn, cn  [L*D, B, stateSize("h"/"c")]     or null when not wanted
  //   lengths [B], each in [1, T], any order   or null when every sequence has T steps
  void forward(const float* input, int64_t steps, int64_t batch, const float* h0, const float* c0,
               const int64_t* lengths, float* output, float* hn, float* cn) const;
  // The same for a cell with side inputs: one buffer per name of sideInputNames(), laid out as
  // `input` with sideInputSize(name) features.
  void forward(const float* input, const std::map<std::string, const float*>& sideInputs,
               int64_t steps, int64_t batch, const float* h0, const float* c0,
               const int64_t* lengths, float* output, float* hn, float* cn) const;

  // The same for any cell, every buffer by name.
  void forward(const SequenceBuffers& buffers, int64_t steps, int64_t batch) const;

  // The same on PyTorch's packed form (torch.nn.utils.rnn.PackedSequence):
  //   data         [sum(batchSizes), inputSize()]: step 0's rows, then step 1's, ...; within a
  //                step, sequences in sorted (longest first) order
  //   batchSizes   [steps], non-increasing: sequences still running at each step
  //   sortedIndices [batch]: the caller's batch index of each sorted position (null: identity);
  //                h0/c0/hn/cn are in the caller's order, as PyTorch's are
  //   outputData   [sum(batchSizes), outputSize()], packed like data
  void forwardPacked(const float* data, const int64_t* batchSizes, int64_t steps,
                     const int64_t* sortedIndices, const float* h0, const float* c0,
                     float* outputData, float* hn, float* cn) const;

  // Training: forward() that also returns what backward() reads (the first call compiles the
  // layer's training forward and backward, derived from the cell).
  TrainingRecord forwardTraining(const float* input, int64_t steps, int64_t batch, const float* h0,
                                 const float* c0, const int64_t* lengths, float* output, float* hn,
                                 float* cn) const;
  // The gradients of loss = sum(output * gradOutput) + sum(hn * gradHn) + sum(cn * gradCn)
  // (a null gradient is zeros), as torch.autograd gives them: every parameter under its name in
  // the weights, "input" (laid out as the input), "h0" and "c0" ([L*D, B, stateSize]).
  std::map<std::string, WeightTensor> backward(const TrainingRecord& record,
                                               const float* gradOutput, const float* gradHn,
                                               const float* gradCn) const;
  // The same for any cell, every buffer by name. backward() then gives, besides the parameters'
  // and "input", each side input's gradient under its name and each initial state's under
  // "h0", "c0" or (another state) the state's own name; gradFinalStates by state name.
  TrainingRecord forwardTraining(const SequenceBuffers& buffers, int64_t steps,
                                 int64_t batch) const;
  std::map<std::string, WeightTensor>
  backward(const TrainingRecord& record, const float* gradOutput,
           const std::map<std::string, const float*>& gradFinalStates) const;
  // The same, each parameter's gradient added into `sums` instead of returned (the input's,
  // the side inputs' and the initial states' are returned as above). If it throws, `sums` is
  // left unusable (take() throws): it may miss the call's part, or hold some of it.
  std::map<std::string, WeightTensor>
  backward(const TrainingRecord& record, const float* gradOutput,
           const std::map<std::string, const float*>& gradFinalStates, GradientSums& sums) const;

  struct Impl;

private:
  explicit Layer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// One step of a cell, as torch.nn.RNNCell, LSTMCell and GRUCell: weights named weight_ih,
// weight_hh, bias_ih, bias_hh (a cell's state_dict; layer names such as weight_ih_l0 work too).
class CellStep {
public:
  static CellStep fromFile(const std::string& cell, const std::string& weightsPath);
  static CellStep fromWeights(const std::string& cell,
                              const std::map<std::string, WeightTensor>& weights);

  int64_t inputSize() const;
  int64_t stateSize(const std::string& state) const; // "h", "c"

  // One step for a batch: x [B, inputSize()], h and c [B, stateSize] (null for zeros; c only for
  // cells with c), written to hNext and cNext (cNext may be null). Thread-safe.
  void step(const float* x, int64_t batch, const float* h, const float* c, float* hNext,
            float* cNext) const;
  // Any cell's step, every buffer by name (side inputs, states other than h and c): `buffers`
  // as for Layer::forward over one step, each sequence [B, features]; finalStates receive the
  // next states, and output (when not null) the step's output.
  void step(const SequenceBuffers& buffers, int64_t batch) const;
  std::vector<std::string> stateNames() const; // in the cell's order

private:
  explicit CellStep(Layer layer) : layer_(std::move(layer)) {}
  Layer layer_;
};

// Memory rnnc keeps for reuse. Buffers of 128 KB and more (tensors, packed weights, a run's
// workspace, a training step's records and gradients) are not returned to the system when
// freed but kept for the next buffer of their size, so that a layer called again, or the next
// training step, meets no page faults (the kernel's zeroing of fresh memory costs milliseconds
// a call in a VM). At most cachedMemoryLimit() bytes are kept, a gigabyte unless set; the
// oldest go first. An application done with rnnc for a while can have the memory back.
size_t cachedMemoryBytes();                // what is kept now
size_t releaseCachedMemory();              // returns it all to the system: its bytes
size_t cachedMemoryLimit();                // the most kept
size_t setCachedMemoryLimit(size_t bytes); // 0: keep none; returns the bytes it let go

} // namespace rnnc
