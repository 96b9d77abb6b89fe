#include "runtime/exec/CompiledCell.h"

#include "codegen/Compiler.h"
#include "codegen/RunArgs.h"
#include "ir/Error.h"
#include "ir/Printer.h"
#include "runtime/exec/AmxPermission.h"
#include "runtime/exec/Kernels.h"
#include "runtime/exec/TargetMemo.h"
#include "runtime/layers/PackedBatch.h"
#include "runtime/threads/ForkSafety.h"
#include "runtime/threads/ThreadGovernor.h"
#include "runtime/threads/ThreadTeam.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <unordered_map>

namespace rnnc {

namespace {

// Each input's row stride, as RnncRunArgs::inputStrides.
std::vector<int64_t> stridesOf(const std::vector<InputRows>& inputs) {
  std::vector<int64_t> strides;
  for (const InputRows& input : inputs)
    strides.push_back(input.stride);
  return strides;
}

// What one thread takes to pack a product's weights, per weight (the weights of a 1024 LSTM, 8M,
// took 10-11 ms as fp32 or fp16, 18.5 as bf16 pairs, 28 quantized to int8: Zen 4, 1 thread).
std::chrono::nanoseconds packingTime(const codegen::StoragePlan& plan) {
  double ns = 0;
  for (const codegen::PackedProduct& product : plan.packedProducts) {
    const double perWeight = product.weights == codegen::WeightType::I8     ? 3.5
                             : product.weights == codegen::WeightType::BF16 ? 2.3
                                                                            : 1.3;
    ns += perWeight * static_cast<double>(product.depth) * static_cast<double>(product.columns);
  }
  return std::chrono::nanoseconds(static_cast<int64_t>(ns));
}

// The bytes of a chunk's pre buffers (the premultiplied inputs, written by the pre phase and
// read by the steps that follow): where the pre phase's products outrun fp32 FMAs (int8 through
// vpdpbusd, bf16 pairs through vdpbf16ps), what one core's L2 holds, so that the steps read
// those rows from L2 rather than memory; else, and at most, `limit`
// (CompileOptions::sequenceBufferBytes): an fp32 pre phase takes long enough for memory to keep
// up, and each chunk costs its weights read again and a wake of the threads. Measured on Zen 4,
// alternating runs, the default LSTM (T=100 B=64 I=H=512), L2-sized chunks (1 MB, 2 steps)
// against 32 MB ones: int8 77.0 -> 71.5 ms on 1 thread (the steps had stalled on the
// premultiplied rows: 8% of their time), 39.5 -> 36.0 on 2; bf16 133 -> 128 and 66.6 -> 65.3
// (chunks as big as its 2 MB of input weights: 130 -> 137 and 67.5 -> 68.7); at I=H=1024
// (T=50, 4 MB of int8 input weights) 1 MB, 4 MB and 32 MB chunks measured alike; but fp32 on
// 2 threads 125 -> 127, fp16 137 -> 144.
int64_t chunkBytesFor(const codegen::StoragePlan& plan, const codegen::Target& target,
                      int64_t limit) {
  for (const codegen::PackedProduct& product : plan.packedProducts)
    if (product.splitRows && (product.weights == codegen::WeightType::I8 || product.depthPairs))
      return std::min(limit, target.l2Bytes);
  return limit;
}

// A core's matrix-product rate, roughly (32 FLOP a cycle at a few GHz): the estimate of what one
// thread takes errs short, so a call it calls short is.
constexpr double kOneThreadFlopsPerSecond = 100e9;

// Code compiled in this process, by cache key: while a cell holds it, and the last few used
// besides, so that a program rebuilt for new weights (rnnc.nn's modules after each optimiser
// step, which free the old program first so that its buffers are reused) finds its code here
// rather than loading it again from the disk cache (a load and relocation of the object, and
// mapped pages made executable: about 0.2 ms a cell).
struct MemoryCache {
  static constexpr size_t kRecentlyUsed = 32;
  std::mutex mutex;
  std::unordered_map<std::string, std::weak_ptr<CompiledCell>> cells;
  std::deque<std::shared_ptr<CompiledCell>> recent; // most recent first

  // Under the lock.
  void used(const std::shared_ptr<CompiledCell>& cell) {
    auto it = std::find(recent.begin(), recent.end(), cell);
    if (it != recent.end())
      recent.erase(it);
    recent.push_front(cell);
    if (recent.size() > kRecentlyUsed)
      recent.pop_back();
  }
};

MemoryCache& memoryCache() {
  static auto* cache = new MemoryCache; // never destroyed: held across fork() for good
  static const HeldAcrossFork forkHold(cache->mutex);
  return *cache;
}

double millisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

} // namespace

// What compile() knows before it loads code: the cell through the passes, its plan and the
// code's cache key, and the result where the memory cache had the code.
struct CompiledCell::Lookup {
  std::shared_ptr<CompiledCell> compiled;
  std::optional<CellBuild> build;
  std::string key;
  std::chrono::steady_clock::time_point start;
  bool found = false;
};

CompiledCell::Lookup CompiledCell::lookUp(const ir::Cell& cell, const CompileOptions& options) {
  Lookup lookup;
  lookup.start = std::chrono::steady_clock::now();
  auto compiled = std::make_shared<CompiledCell>();
  CellBuild build = planCell(optimiseCell(cell, options.pipeline, options.log),
                             runnableTarget(options.targetCpu, options.cache), options.weights,
                             codegen::kGpuStepBlockTiles, options.widenCachedFp16);
  compiled->cell_ = build.cell;
  compiled->plan_ = build.plan;
  if (std::any_of(build.plan.packedProducts.begin(), build.plan.packedProducts.end(),
                  [](const codegen::PackedProduct& product) { return product.amxTiles; }))
    requestAmxTiles();
  compiled->sequenceBufferBytes_ =
      chunkBytesFor(build.plan, build.target, options.sequenceBufferBytes);
  compiled->flopsPerRow_ = ir::matrixProductFlopsPerStep(*build.cell, 1);
  compiled->packingOnOneThread_ = packingTime(build.plan);
  lookup.key = build.cacheKey();
  lookup.compiled = std::move(compiled);

  if (options.memoryCache) {
    MemoryCache& memory = memoryCache();
    std::lock_guard<std::mutex> lock(memory.mutex);
    if (auto it = memory.cells.find(lookup.key); it != memory.cells.end())
      if (std::shared_ptr<CompiledCell> earlier = it->second.lock()) {
        lookup.compiled->function_ = earlier->function_;
        lookup.compiled->lifetime_ = earlier->lifetime_;
        lookup.compiled->source_ = CodeSource::MemoryCache;
        lookup.compiled->compileMs_ = millisecondsSince(lookup.start);
        memory.used(earlier);
        lookup.found = true;
        return lookup;
      }
  }
  lookup.build.emplace(std::move(build));
  return lookup;
}

std::shared_ptr<CompiledCell> CompiledCell::load(Lookup&& lookup, const CompileOptions& options) {
  std::shared_ptr<CompiledCell> compiled = std::move(lookup.compiled);
  if (lookup.found)
    return compiled;
  LoadedCode code = lookup.build->load(options.cache);
  compiled->source_ = code.fromDisk ? CodeSource::DiskCache : CodeSource::Compiled;
  compiled->function_ = reinterpret_cast<void (*)(const void*)>(code.loaded.address);
  compiled->lifetime_ = std::move(code.loaded.lifetime);
  compiled->compileMs_ = millisecondsSince(lookup.start);
  if (options.memoryCache) {
    MemoryCache& memory = memoryCache();
    std::lock_guard<std::mutex> lock(memory.mutex);
    memory.cells[lookup.key] = compiled;
    memory.used(compiled);
  }
  return compiled;
}

std::shared_ptr<CompiledCell> CompiledCell::compile(const ir::Cell& cell,
                                                    const CompileOptions& options) {
  return load(lookUp(cell, options), options);
}

std::vector<std::shared_ptr<CompiledCell>>
CompiledCell::compileAll(const std::vector<const ir::Cell*>& cells, const CompileOptions& options) {
  // Identical cells (the directions of a bidirectional layer, layers past the first) by their
  // printed IR: sizes, names and every op are in it.
  std::vector<size_t> firstOf(cells.size());
  std::vector<size_t> distinct;
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < cells.size(); ++i) {
    firstOf[i] = i;
    if (cells.size() > 1) { // one cell (one layer, one direction) needs no printing
      auto [it, inserted] = seen.emplace(ir::toString(*cells[i]), i);
      firstOf[i] = it->second;
      if (!inserted)
        continue;
    }
    distinct.push_back(i);
  }
  // The passes and the memory cache first, one cell after another (a program rebuilt for new
  // weights finds all its code there, and starts no thread); then the code the cache lacks,
  // side by side.
  std::vector<std::shared_ptr<CompiledCell>> result(cells.size());
  std::vector<std::exception_ptr> failures(cells.size());
  std::vector<std::optional<Lookup>> lookups(cells.size());
  std::vector<size_t> missing;
  for (size_t i : distinct) {
    try {
      lookups[i].emplace(lookUp(*cells[i], options));
      if (lookups[i]->found)
        result[i] = std::move(lookups[i]->compiled);
      else
        missing.push_back(i);
    } catch (...) {
      failures[i] = std::current_exception();
    }
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t d; (d = next.fetch_add(1)) < missing.size();) {
      const size_t i = missing[d];
      try {
        result[i] = load(std::move(*lookups[i]), options);
      } catch (...) {
        failures[i] = std::current_exception();
      }
    }
  };
  const size_t workers =
      options.log
          ? 1
          : std::min<size_t>(missing.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> helpers;
  for (size_t w = 1; w < workers; ++w)
    helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers)
    helper.join();
  for (size_t i : distinct)
    if (failures[i])
      std::rethrow_exception(failures[i]);
  for (size_t i = 0; i < cells.size(); ++i)
    result[i] = result[firstOf[i]];
  return result;
}

namespace {

// The threads of one call: a team leased for it, or none for one thread. An automatic count
// (0) is ThreadGovernor's choice, and the call reports back how it went, once, over all its
// phases and stretches.
class RunThreads {
public:
  // `oneThread`: what the call would take on one thread, about (an automatic count keeps short
  // calls on one thread).
  RunThreads(int threads, std::chrono::nanoseconds oneThread) : automatic_(threads == 0) {
    checkThreadCount(threads);
    if (automatic_) {
      const int most = defaultThreadCount();
      threads = ThreadGovernor::shared().threadsFor(most, oneThread,
                                                    most > 1 && TeamPool::shared().hasIdle(most));
    }
    if (threads > 1) {
      lease_.emplace(TeamPool::shared().acquire(threads));
      lease_->team->barrier().takeSlept(); // count from this call on
    }
  }
  RunThreads(const RunThreads&) = delete;
  RunThreads& operator=(const RunThreads&) = delete;

  ~RunThreads() {
    if (automatic_ && lease_)
      ThreadGovernor::shared().report(lease_->team->size(), wall_,
                                      lease_->team->barrier().takeSlept());
  }

  // How many threads each call runs on.
  int size() const { return lease_ ? lease_->team->size() : 1; }

  // Calls `function` once per thread (or once, alone), each with its own index.
  void call(void (*function)(const void*), RnncRunArgs args) {
    ThreadTeam* team = lease_ ? lease_->team.get() : nullptr;
    if (!team) {
      args.thread = 0;
      args.threads = 1;
      args.team = nullptr;
      return function(&args);
    }
    auto start = ThreadGovernor::Clock::now();
    team->run([&](int thread) {
      RnncRunArgs mine = args;
      mine.thread = thread;
      mine.threads = team->size();
      mine.team = &team->barrier();
      function(&mine);
    });
    wall_ += ThreadGovernor::Clock::now() - start;
  }

private:
  bool automatic_;
  std::optional<TeamPool::Lease> lease_;
  ThreadGovernor::Clock::duration wall_{};
};

} // namespace

InputRows InputRows::of(const Tensor& t) {
  const int64_t columns = t.rank() == 0 ? 0 : t.shape().back();
  return {t.data(), columns == 0 ? 0 : t.numel() / columns, columns, columns};
}

namespace {

std::vector<InputRows> rowsOf(const std::vector<Tensor>& inputs) {
  std::vector<InputRows> rows;
  for (const Tensor& input : inputs)
    rows.push_back(InputRows::of(input));
  return rows;
}

} // namespace

void CompiledCell::checkArity(const std::vector<InputRows>& inputs,
                              const std::vector<Tensor>& states) const {
  RNNC_INTERNAL_CHECK(inputs.size() == cell_->inputs.size(), "wrong number of inputs");
  RNNC_INTERNAL_CHECK(states.size() == cell_->states.size(), "wrong number of states");
  for (size_t i = 0; i < inputs.size(); ++i)
    RNNC_INTERNAL_CHECK(inputs[i].columns == ir::columnsOf(cell_->inputs[i].get()) &&
                            inputs[i].stride >= inputs[i].columns,
                        "input " + cell_->inputs[i]->name + " has the wrong width");
}

std::shared_ptr<const CompiledCell::Prepared>
CompiledCell::prepare(const std::vector<Tensor>& params, int threads) const {
  RNNC_INTERNAL_CHECK(params.size() == cell_->params.size(), "wrong number of parameters");
  auto prepared = std::make_shared<Prepared>();
  prepared->params = dataPointers(params);
  constexpr int64_t lineFloats = kCacheLineBytes / sizeof(float);
  std::vector<int64_t> offsets(plan_.buffers.size(), -1);
  int64_t floats = 0;
  for (size_t i = 0; i < plan_.buffers.size(); ++i)
    if (plan_.buffers[i].rows == codegen::Rows::Fixed) {
      offsets[i] = floats;
      const int64_t size = plan_.buffers[i].floatsFor(plan_.buffers[i].fixedRows);
      floats += (size + lineFloats - 1) / lineFloats * lineFloats;
    }
  // Not cleared: the parameter phase below writes every float of the fixed buffers that the code
  // reads (packed weights with their zero padding, values hoisted out of the loop). Clearing was
  // a second write of megabytes at each build, and a training step builds anew (an LSTM at
  // I=H=512: 0.6 of its 4.5 ms). Under ASan they start as NaN (AlignedBuffer::uninitialized), so
  // a float read without being written shows in the tests; they and the cell fuzzer (fp32, the
  // reduced types, gradients, the emulated GPU) passed with this memory NaN in a Release build.
  prepared->fixedMemory = AlignedBuffer::uninitialized(floats);
  prepared->fixed.assign(plan_.buffers.size(), nullptr);
  for (size_t i = 0; i < plan_.buffers.size(); ++i)
    if (offsets[i] >= 0)
      prepared->fixed[i] = prepared->fixedMemory.data() + offsets[i];
  std::vector<float*> buffers = prepared->fixed;
  // The generated code loads every argument pointer on entry; this phase reads none of the
  // inputs and states.
  std::vector<const float*> noInputs(cell_->inputs.size(), nullptr);
  std::vector<float*> noStates(cell_->states.size(), nullptr);
  std::vector<int64_t> noStrides(cell_->inputs.size(), 0);
  RnncRunArgs args{0,
                   0,
                   prepared->params.data(),
                   noInputs.data(),
                   noStates.data(),
                   nullptr,
                   buffers.data(),
                   RNNC_PHASE_PARAMS,
                   0,
                   1,
                   nullptr,
                   noStrides.data(),
                   0,
                   0,
                   0};
  RunThreads(threads, packingOnOneThread_).call(function_, args);
  return prepared;
}

std::chrono::nanoseconds CompiledCell::oneThreadTime(int64_t rows) const {
  return std::chrono::nanoseconds(static_cast<int64_t>(flopsPerRow_ * static_cast<double>(rows) /
                                                       kOneThreadFlopsPerSecond * 1e9));
}

std::vector<float*> CompiledCell::bufferPointers(const Prepared& prepared, Workspace& workspace,
                                                 int64_t sequenceRows, int64_t stepRows,
                                                 int threads) const {
  // Every buffer is fully written before it is read, so reused memory needs no clearing. The
  // generated code only reads the fixed ones in these phases.
  workspace.buffers.resize(plan_.buffers.size());
  std::vector<float*> result;
  for (size_t i = 0; i < plan_.buffers.size(); ++i) {
    const codegen::BufferSpec& spec = plan_.buffers[i];
    if (spec.rows == codegen::Rows::Fixed) {
      result.push_back(prepared.fixed.at(i));
      continue;
    }
    int64_t rows = spec.rows == codegen::Rows::Sequence        ? sequenceRows
                   : spec.rows == codegen::Rows::Step          ? stepRows
                   : spec.rows == codegen::Rows::PerThreadStep ? threads * stepRows
                                                               : threads * spec.fixedRows;
    if (workspace.buffers[i].size() != rows * spec.cols)
      workspace.buffers[i] = AlignedBuffer::uninitialized(rows * spec.cols);
    result.push_back(workspace.buffers[i].data());
  }
  return result;
}

Tensor CompiledCell::run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                         std::vector<Tensor>& states) const {
  Tensor output;
  Workspace workspace;
  run(params, inputs, states, output, workspace, 1);
  return output;
}

void CompiledCell::run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
                       std::vector<Tensor>& states, Tensor& output, Workspace& workspace,
                       int threads) const {
  run(*prepare(params, threads), inputs, states, output, workspace, threads);
}

void CompiledCell::run(const Prepared& prepared, const std::vector<Tensor>& inputs,
                       std::vector<Tensor>& states, Tensor& output, Workspace& workspace,
                       int threads) const {
  RNNC_INTERNAL_CHECK(!inputs.empty() && inputs[0].rank() == 3, "inputs must be [T, B, F]");
  run(prepared, inputs[0].dim(0), inputs[0].dim(1), rowsOf(inputs), states, output, workspace,
      threads);
}

void CompiledCell::run(const Prepared& prepared, int64_t steps, int64_t batch,
                       const std::vector<InputRows>& inputs, std::vector<Tensor>& states,
                       Tensor& output, Workspace& workspace, int threads, bool reverse,
                       uint64_t maskSeed) const {
  checkArity(inputs, states);
  for (const InputRows& input : inputs)
    RNNC_INTERNAL_CHECK(input.rows == steps * batch, "inputs' rows differ");
  TensorShape outputShape{steps, batch, ir::columnsOf(cell_->output)};
  if (output.shape() != outputShape) // every row of every step is written
    output = Tensor::uninitialized(outputShape);
  if (steps == 0 || batch == 0)
    return;
  RunThreads team(threads, oneThreadTime(steps * batch));
  // Steps per chunk: as many as the pre buffers' memory allows, at least one.
  const int64_t rowBytes = std::max<int64_t>(1, sequenceBytesPerRow());
  const int64_t chunk = std::clamp<int64_t>(sequenceBufferBytes_ / (rowBytes * batch), 1,
                                            std::max<int64_t>(steps, 1));
  std::vector<float*> buffers =
      bufferPointers(prepared, workspace, chunk * batch, batch, team.size());
  std::vector<float*> statePointers = mutableDataPointers(states);
  const int64_t outCols = ir::columnsOf(cell_->output);
  std::vector<const float*> chunkInputs(inputs.size());
  const std::vector<int64_t> strides = stridesOf(inputs);
  // In reverse, the chunks from the last to the first, each run backwards by the loop.
  const int64_t chunks = (steps + chunk - 1) / chunk;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = (reverse ? chunks - 1 - c : c) * chunk;
    const int64_t chunkSteps = std::min(chunk, steps - first);
    // The steps run before this chunk's: in reverse, those after it.
    const int64_t stepsBefore = reverse ? steps - first - chunkSteps : first;
    for (size_t i = 0; i < inputs.size(); ++i)
      chunkInputs[i] = inputs[i].data + first * batch * inputs[i].stride;
    RnncRunArgs args{chunkSteps,
                     batch,
                     prepared.params.data(),
                     chunkInputs.data(),
                     statePointers.data(),
                     output.data() + first * batch * outCols,
                     buffers.data(),
                     RNNC_PHASE_PRE | RNNC_PHASE_LOOP,
                     0,
                     1,
                     nullptr,
                     strides.data(),
                     reverse ? 1 : 0,
                     maskSeed,
                     stepsBefore * batch};
    team.call(function_, args);
  }
}

int64_t CompiledCell::sequenceBytesPerRow() const {
  int64_t bytes = 0;
  for (const codegen::BufferSpec& spec : plan_.buffers)
    if (spec.rows == codegen::Rows::Sequence)
      bytes += spec.cols * static_cast<int64_t>(sizeof(float));
  return bytes;
}

void CompiledCell::runPacked(const Prepared& prepared, const std::vector<Tensor>& inputs,
                             const std::vector<int64_t>& batchSizes, std::vector<Tensor>& states,
                             Tensor& output, Workspace& workspace, int threads) const {
  for (const Tensor& input : inputs)
    RNNC_INTERNAL_CHECK(input.rank() == 2, "packed inputs must be [N, F]");
  runPacked(prepared, rowsOf(inputs), batchSizes, states, output, workspace, threads);
}

void CompiledCell::runPacked(const Prepared& prepared, const std::vector<InputRows>& inputs,
                             const std::vector<int64_t>& batchSizes, std::vector<Tensor>& states,
                             Tensor& output, Workspace& workspace, int threads,
                             uint64_t maskSeed) const {
  checkArity(inputs, states);
  RNNC_INTERNAL_CHECK(!batchSizes.empty() && batchSizes[0] > 0, "empty packed batch");
  const int64_t rows = std::accumulate(batchSizes.begin(), batchSizes.end(), int64_t{0});
  for (size_t t = 1; t < batchSizes.size(); ++t)
    RNNC_INTERNAL_CHECK(batchSizes[t] <= batchSizes[t - 1], "batch sizes must not increase");
  for (const InputRows& input : inputs)
    RNNC_INTERNAL_CHECK(input.rows == rows, "packed input has wrong rows");
  for (const Tensor& state : states)
    RNNC_INTERNAL_CHECK(state.rank() == 2 && state.dim(0) == batchSizes[0],
                        "state rows differ from the first batch size");
  const int64_t outCols = ir::columnsOf(cell_->output);
  if (output.shape() != TensorShape{rows, outCols}) // every packed row is written
    output = Tensor::uninitialized({rows, outCols});
  // Chunks of whole steps, each as many packed rows as the pre buffers' memory allows (at least
  // one step).
  const int64_t rowBytes = std::max<int64_t>(1, sequenceBytesPerRow());
  const int64_t maxRows = std::max<int64_t>(batchSizes[0], sequenceBufferBytes_ / rowBytes);
  struct Chunk {
    size_t firstStep, endStep;
    int64_t firstRow, rows;
  };
  std::vector<Chunk> chunks;
  for (size_t t = 0, row = 0; t < batchSizes.size() && batchSizes[t] > 0;) {
    Chunk c{t, t, static_cast<int64_t>(row), 0};
    while (c.endStep < batchSizes.size() && batchSizes[c.endStep] > 0 &&
           (c.rows == 0 || c.rows + batchSizes[c.endStep] <= maxRows))
      c.rows += batchSizes[c.endStep++];
    chunks.push_back(c);
    t = c.endStep;
    row += static_cast<size_t>(c.rows);
  }
  int64_t chunkRows = 0;
  for (const Chunk& c : chunks)
    chunkRows = std::max(chunkRows, c.rows);

  RunThreads team(threads, oneThreadTime(rows));
  std::vector<float*> buffers =
      bufferPointers(prepared, workspace, chunkRows, batchSizes[0], team.size());
  std::vector<float*> statePointers = mutableDataPointers(states);
  const std::vector<int64_t> strides = stridesOf(inputs);
  // The inputs, buffers and output of the rows from packed row `row` on; the chunk's pre
  // buffers start at its first row.
  std::vector<const float*> rowInputs(inputs.size());
  std::vector<float*> rowBuffers(buffers);
  auto at = [&](int64_t row, int64_t chunkRow) {
    for (size_t i = 0; i < inputs.size(); ++i)
      rowInputs[i] = inputs[i].data + row * inputs[i].stride;
    for (size_t i = 0; i < plan_.buffers.size(); ++i)
      if (plan_.buffers[i].rows == codegen::Rows::Sequence)
        rowBuffers[i] = buffers[i] + chunkRow * plan_.buffers[i].cols;
    return output.data() + row * outCols;
  };
  for (const Chunk& c : chunks) {
    // Every packed row of the chunk at once: one big input GEMM.
    float* chunkOutput = at(c.firstRow, 0);
    RnncRunArgs pre{1,
                    c.rows,
                    prepared.params.data(),
                    rowInputs.data(),
                    statePointers.data(),
                    chunkOutput,
                    rowBuffers.data(),
                    RNNC_PHASE_PRE,
                    0,
                    1,
                    nullptr,
                    strides.data(),
                    0,
                    maskSeed,
                    c.firstRow};
    team.call(function_, pre);
    // Each stretch of steps with one active batch reads and writes its own rows.
    std::vector<int64_t> chunkSizes(batchSizes.begin() + static_cast<std::ptrdiff_t>(c.firstStep),
                                    batchSizes.begin() + static_cast<std::ptrdiff_t>(c.endStep));
    for (const Stretch& stretch : stretchesOf(chunkSizes)) {
      float* stretchOutput = at(c.firstRow + stretch.firstRow, stretch.firstRow);
      RnncRunArgs loop{stretch.steps,
                       stretch.active,
                       prepared.params.data(),
                       rowInputs.data(),
                       statePointers.data(),
                       stretchOutput,
                       rowBuffers.data(),
                       RNNC_PHASE_LOOP,
                       0,
                       1,
                       nullptr,
                       strides.data(),
                       0,
                       maskSeed,
                       c.firstRow + stretch.firstRow};
      team.call(function_, loop);
    }
  }
}

} // namespace rnnc
