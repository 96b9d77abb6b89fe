// End-to-end tests of the `rnnc` command-line tool: the real binary is run as a user would run it.
//  - `rnnc run` on every PyTorch fixture (tests/fixtures) matches PyTorch within 1e-5;
//  - help, `dump`, and the zero default for absent initial states;
//  - every kind of bad input exits with status 1 and a message on stderr with the key facts.
#include "ir/Error.h"
#include "ir/FileIO.h"
#include "runtime/data/Npy.h"
#include "runtime/data/SafeTensors.h"
#include "runtime/gpu/CudaDriver.h"
#include "tests/TestSupport.h"
#include "tests/ToolRunner.h"
#include "tools/Timing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace rnnc {
namespace {

namespace fs = std::filesystem;
using test::ToolResult;
using test::ToolRunner;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const fs::path kFixtures = fs::path(RNNC_SOURCE_DIR) / "tests" / "fixtures";

std::vector<std::string> fixtureCases() {
  std::vector<std::string> cases;
  for (const auto& entry : fs::directory_iterator(kFixtures))
    if (entry.is_directory() && fs::exists(entry.path() / "meta.json"))
      cases.push_back(entry.path().filename().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

// Gives each test a fresh scratch directory (removed afterwards) and a ToolRunner working in it.
class ToolTest : public ::testing::Test {
protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("rnnc_tool_") + info->test_suite_name() + "_" + info->name() +
                       "_" + std::to_string(::getpid());
    std::replace(name.begin(), name.end(), '/', '_'); // parameterised names contain '/'
    dir_ = fs::path(::testing::TempDir()) / name;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  ToolResult run(const std::vector<std::string>& args) const { return ToolRunner(dir_).run(args); }
  ToolResult run(const std::vector<std::string>& args, const std::string& shellPrefix) const {
    return ToolRunner(dir_).run(args, shellPrefix);
  }

  // Runs the tool and expects a clean failure: exit status 1 (not a crash, not success), nothing
  // on stdout, and a stderr that contains every fragment.
  void expectError(const std::vector<std::string>& args,
                   std::initializer_list<std::string> fragments) const {
    ToolResult r = run(args);
    EXPECT_EQ(r.exitCode, 1) << r;
    EXPECT_EQ(r.out, "") << r;
    for (const std::string& fragment : fragments)
      EXPECT_THAT(r.err, HasSubstr(fragment)) << r;
  }

  fs::path dir_;
};

std::string fixtureFile(const std::string& caseName, const std::string& file) {
  return (kFixtures / caseName / file).string();
}

std::string readBytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeBytes(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

float maxAbsDiff(const Tensor& a, const Tensor& b) {
  float worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = test::worseOf(worst, std::fabs(a.data()[i] - b.data()[i]));
  return worst;
}

void expectClose(const std::string& actualPath, const std::string& expectedPath) {
  SCOPED_TRACE(actualPath);
  Tensor actual = readNpyFloat32(actualPath);
  Tensor expected = readNpyFloat32(expectedPath);
  ASSERT_EQ(actual.shape(), expected.shape());
  EXPECT_LE(maxAbsDiff(actual, expected), 1e-5f);
}

// `rnnc run` of a PyTorch fixture: its cell, weights, input and initial states, writing the
// output to `output`.
std::vector<std::string> fixtureRunArgs(const std::string& name, const std::string& output) {
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(fixtureFile(name, "meta.json")));
  std::vector<std::string> args = {"run",
                                   "--cell",
                                   meta.at("cell").get<std::string>(),
                                   "--weights",
                                   fixtureFile(name, "weights.safetensors"),
                                   "--input",
                                   fixtureFile(name, "input.npy"),
                                   "--h0",
                                   fixtureFile(name, "h0.npy"),
                                   "--output",
                                   output};
  if (meta.at("has_c").get<bool>())
    args.insert(args.end(), {"--c0", fixtureFile(name, "c0.npy")});
  return args;
}

// ---- Every PyTorch fixture through `rnnc run` ------------------------------------------------

class ToolFixtureRun : public ToolTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(ToolFixtureRun, MatchesPyTorchWithin1e5) {
  const std::string name = GetParam();
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(fixtureFile(name, "meta.json")));
  const bool hasC = meta.at("has_c").get<bool>();
  std::vector<std::string> args = fixtureRunArgs(name, path("out.npy"));
  args.insert(args.end(), {"--hn", path("hn.npy")});
  if (hasC)
    args.insert(args.end(), {"--cn", path("cn.npy")});

  ToolResult r = run(args);
  ASSERT_EQ(r.exitCode, 0) << r;
  EXPECT_EQ(r.err, "") << r;

  const int64_t T = meta.at("seq_len"), B = meta.at("batch"), H = meta.at("hidden_size");
  EXPECT_EQ(readNpyFloat32(path("out.npy")).shape(), (TensorShape{T, B, H}));
  expectClose(path("out.npy"), fixtureFile(name, "output.npy"));
  expectClose(path("hn.npy"), fixtureFile(name, "hn.npy"));
  if (hasC)
    expectClose(path("cn.npy"), fixtureFile(name, "cn.npy"));
  else
    EXPECT_FALSE(fs::exists(path("cn.npy")));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ToolFixtureRun, ::testing::ValuesIn(fixtureCases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(ToolFixtures, EveryCellHasFixtures) {
  std::vector<std::string> cases = fixtureCases();
  EXPECT_GE(cases.size(), 26u);
  for (const char* cell : {"lstm", "gru", "rnn_tanh", "rnn_relu", "lnlstm", "peephole_lstm"})
    EXPECT_TRUE(std::count(cases.begin(), cases.end(), std::string(cell) + "_small")) << cell;
}

// Without --h0/--c0 the initial states are zeros: the same results as explicit zero files.
TEST_F(ToolTest, AbsentInitialStatesAreZeros) {
  const std::string name = "lstm_small";
  const TensorShape stateShape = readNpyFloat32(fixtureFile(name, "h0.npy")).shape();
  writeNpy(path("zeros.npy"), Tensor(stateShape, 0.0f));
  const std::vector<std::string> common = {"run",
                                           "--cell",
                                           "lstm",
                                           "--weights",
                                           fixtureFile(name, "weights.safetensors"),
                                           "--input",
                                           fixtureFile(name, "input.npy")};

  std::vector<std::string> implicit = common;
  implicit.insert(implicit.end(), {"--output", path("out_implicit.npy"), "--hn",
                                   path("hn_implicit.npy"), "--cn", path("cn_implicit.npy")});
  ToolResult r = run(implicit);
  ASSERT_EQ(r.exitCode, 0) << r;

  std::vector<std::string> explicitZeros = common;
  explicitZeros.insert(explicitZeros.end(), {"--h0", path("zeros.npy"), "--c0", path("zeros.npy"),
                                             "--output", path("out_zeros.npy"), "--hn",
                                             path("hn_zeros.npy"), "--cn", path("cn_zeros.npy")});
  r = run(explicitZeros);
  ASSERT_EQ(r.exitCode, 0) << r;

  Tensor out = readNpyFloat32(path("out_implicit.npy"));
  EXPECT_EQ(out.shape(), readNpyFloat32(fixtureFile(name, "output.npy")).shape());
  for (float v : out.values())
    ASSERT_TRUE(std::isfinite(v));
  for (const char* file : {"out", "hn", "cn"}) {
    SCOPED_TRACE(file);
    Tensor implicitResult = readNpyFloat32(path(std::string(file) + "_implicit.npy"));
    Tensor zerosResult = readNpyFloat32(path(std::string(file) + "_zeros.npy"));
    ASSERT_EQ(implicitResult.shape(), zerosResult.shape());
    // Not bit for bit: today the last bit of a result can depend on the heap addresses of the
    // tensors (Eigen's unaligned maps), which differ between the two runs.
    EXPECT_LE(maxAbsDiff(implicitResult, zerosResult), 1e-6f);
  }
  // The fixture's own initial state is random, so its results must differ from these.
  EXPECT_GT(maxAbsDiff(out, readNpyFloat32(fixtureFile(name, "output.npy"))), 1e-3f);
}

// ---- Help and usage ----------------------------------------------------------------------------

// Threads: more than the documented maximum is a clear error, and when the system cannot start
// the threads asked for (here: too little address space for their stacks), the error says so,
// where the team's constructor once threw past live threads into std::terminate (exit 134).
TEST_F(ToolTest, ThreadCountsTheSystemCannotGiveAreErrorsNotAborts) {
  const std::vector<std::string> bench = {"bench", "--seq",    "3", "--batch",  "2", "--input",
                                          "4",     "--hidden", "4", "--repeat", "1", "--jit-only"};
  std::vector<std::string> tooMany = bench;
  tooMany.insert(tooMany.end(), {"--threads", "100000"});
  ToolResult r = run(tooMany);
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("100000 threads: at most")) << r;
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the limit this test sets";
#else
  std::vector<std::string> refused = bench;
  refused.insert(refused.end(), {"--threads", "3000"});
  r = ToolRunner(dir_).run(refused, "ulimit -v 1500000; export RNNC_MAX_THREADS=5000; ");
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("cannot start 3000 threads")) << r;
#endif
}

// Two threads dividing the recurrent products' column blocks unevenly (RNNC_THREAD_SHARES fixes
// what runtime/threads/WorkBalance.h would measure), either way round, give PyTorch's output:
// the blocks a thread computes may change at every barrier. A share list that does not fit
// the run is an error naming the variable.
TEST_F(ToolTest, UnevenThreadSharesMatchPyTorch) {
  for (const std::string name : {"lstm_mid", "gru_mid", "lnlstm_mid", "rnn_tanh_mid"}) {
    std::vector<std::string> args = fixtureRunArgs(name, path(name + ".npy"));
    args.insert(args.end(), {"--threads", "2"});
    for (const std::string shares : {"0.2,0.8", "0.8,0.2"}) {
      SCOPED_TRACE(name + " with shares " + shares);
      ToolResult r = run(args, "export RNNC_THREAD_SHARES=" + shares + "; ");
      ASSERT_EQ(r.exitCode, 0) << r;
      expectClose(path(name + ".npy"), fixtureFile(name, "output.npy"));
    }
  }
  // Reduced-precision weights: every column is computed the same way whichever thread has it,
  // so uneven shares give the equal split's bits.
  for (const std::string dtype : {"int8", "bf16", "fp16"}) {
    std::map<std::string, std::string> outputs;
    for (const std::string shares : {"equal", "0.2,0.8", "0.75,0.25"}) {
      std::vector<std::string> args = fixtureRunArgs("gru_mid", path(dtype + shares + ".npy"));
      args.insert(args.end(), {"--weights-dtype", dtype, "--threads", "2"});
      ToolResult r = run(args, "export RNNC_THREAD_SHARES=" + shares + "; ");
      ASSERT_EQ(r.exitCode, 0) << r;
      outputs[shares] = readFileBytes(path(dtype + shares + ".npy"));
    }
    EXPECT_EQ(outputs["0.2,0.8"], outputs["equal"]) << dtype;
    EXPECT_EQ(outputs["0.75,0.25"], outputs["equal"]) << dtype;
  }
  const std::string fixtureDir = std::string(RNNC_SOURCE_DIR) + "/tests/fixtures/lstm_small/";
  for (const std::string bad : {"0.5", "0.5,x", "0,1"}) {
    ToolResult r =
        run({"run", "--cell", "lstm", "--weights", fixtureDir + "weights.safetensors", "--input",
             fixtureDir + "input.npy", "--threads", "2", "--output", path("bad.npy")},
            "export RNNC_THREAD_SHARES=" + bad + "; ");
    EXPECT_EQ(r.exitCode, 1) << r;
    EXPECT_THAT(r.err, HasSubstr("RNNC_THREAD_SHARES='" + bad + "'")) << r;
  }
}

// Several processes filling one fresh cache at once (each compiles, writes a temporary file and
// renames it into place) all succeed with the same result, and leave one entry per kernel and
// no temporary files; the next process runs from the cache.
TEST_F(ToolTest, ConcurrentProcessesShareOneCache) {
  const std::string fixtureDir = std::string(RNNC_SOURCE_DIR) + "/tests/fixtures/lstm_small/";
  const fs::path cache = dir_ / "shared-cache";
  std::string command = "cd '" + dir_.string() + "' && for i in 1 2 3 4 5 6; do RNNC_CACHE_DIR='" +
                        cache.string() + "' '" + RNNC_TOOL_PATH + "' run --cell lstm --weights '" +
                        fixtureDir + "weights.safetensors' --input '" + fixtureDir +
                        "input.npy' --output out$i.npy 2>err$i.txt & done; wait";
  ASSERT_EQ(std::system(command.c_str()), 0);
  const std::string first = readFileBytes((dir_ / "out1.npy").string());
  for (int i = 1; i <= 6; ++i) {
    EXPECT_EQ(readFileBytes((dir_ / ("err" + std::to_string(i) + ".txt")).string()), "");
    EXPECT_EQ(readFileBytes((dir_ / ("out" + std::to_string(i) + ".npy")).string()), first);
  }
  int entries = 0;
  for (const auto& e : fs::directory_iterator(cache)) {
    // The hit counts (rnnc cache stats) and the host's target (runtime/exec/TargetMemo.h).
    if (e.path().filename() == "stats" || e.path().extension() == ".target")
      continue;
    EXPECT_EQ(e.path().extension(), ".o") << e.path() << " left behind";
    ++entries;
  }
  EXPECT_GE(entries, 1);
  ToolResult again = run({"run", "--cell", "lstm", "--weights", fixtureDir + "weights.safetensors",
                          "--input", fixtureDir + "input.npy", "--output", "again.npy"});
  EXPECT_EQ(again.exitCode, 0) << again;
}

// A process whose kernels and target are in the disk cache loads neither the compiler library
// nor LLVM (codegen/CompilerLibrary.h): with RNNC_COMPILER_LIBRARY pointing nowhere, `rnnc run`
// and `rnnc version` give what they gave with it once the cache is warm; with a cold cache the
// run fails, naming the library and where it was looked for.
TEST_F(ToolTest, AWarmCacheNeedsNoCompilerLibrary) {
  const std::string fixtureDir = std::string(RNNC_SOURCE_DIR) + "/tests/fixtures/lstm_small/";
  auto runArgs = [&](const std::string& output) {
    return std::vector<std::string>{"run",
                                    "--cell",
                                    "lstm",
                                    "--weights",
                                    fixtureDir + "weights.safetensors",
                                    "--input",
                                    fixtureDir + "input.npy",
                                    "--output",
                                    output};
  };
  const std::string warm = "export RNNC_CACHE_DIR='" + path("cache") + "'; ";
  const std::string nowhere = "export RNNC_COMPILER_LIBRARY=/nonexistent/librnnc_compiler.so; ";
  ToolResult filled = run(runArgs("with.npy"), warm);
  ASSERT_EQ(filled.exitCode, 0) << filled;
  ToolResult version = run({"version"}, warm);
  ASSERT_EQ(version.exitCode, 0) << version;

  ToolResult without = run(runArgs("without.npy"), warm + nowhere);
  EXPECT_EQ(without.exitCode, 0) << without;
  EXPECT_EQ(readFileBytes(path("without.npy")), readFileBytes(path("with.npy")));
  ToolResult versionWithout = run({"version"}, warm + nowhere);
  EXPECT_EQ(versionWithout.exitCode, 0) << versionWithout;
  EXPECT_EQ(versionWithout.out, version.out);

  // What generates no code needs no compiler, whatever the cache holds: the IR stages and the
  // interpreter.
  const std::string coldNowhere = "export RNNC_CACHE_DIR='" + path("cold-cache") + "'; " + nowhere;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"dump", "lstm"},
        std::vector<std::string>{"compile", "gru", "--emit=ir-opt"}}) {
    ToolResult r = run(args, coldNowhere);
    EXPECT_EQ(r.exitCode, 0) << r;
    EXPECT_THAT(r.out, HasSubstr("cell @")) << r;
  }
  std::vector<std::string> interpret = runArgs("interpreted.npy");
  interpret.push_back("--interpret");
  ToolResult interpreted = run(interpret, coldNowhere);
  EXPECT_EQ(interpreted.exitCode, 0) << interpreted;

#ifdef RNNC_COMPILER_SHARED
  ToolResult cold =
      run(runArgs("cold.npy"), "export RNNC_CACHE_DIR='" + path("cold-cache") + "'; " + nowhere);
  EXPECT_NE(cold.exitCode, 0) << cold;
  EXPECT_THAT(cold.err, HasSubstr("librnnc_compiler")) << cold;
  EXPECT_THAT(cold.err, HasSubstr("/nonexistent/librnnc_compiler.so")) << cold;
  EXPECT_THAT(cold.err, HasSubstr("RNNC_COMPILER_LIBRARY")) << cold;
#endif
}

#ifdef RNNC_COMPILER_SHARED
// What the dynamic loader maps before the tool's main (LD_TRACE_LOADED_OBJECTS, as ldd asks it):
// the C library's objects and libgcc's unwinder, nothing of C++. libstdc++, fmt and nettle are
// linked in (tools/CMakeLists.txt, ir/FmtLibrary.cpp), since loading the shared libstdc++ alone
// was a quarter of a warm process; LLVM comes with the compiler library, only when it compiles.
TEST_F(ToolTest, TheToolMapsNoSharedCxxLibraryAtStart) {
  ToolResult r = run({"version"}, "export LD_TRACE_LOADED_OBJECTS=1; ");
  ASSERT_EQ(r.exitCode, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("libc.so")) << r;
  for (const char* library :
       {"libstdc++", "libgcc_s", "libfmt", "libnettle", "libLLVM", "librnnc_compiler"})
    EXPECT_THAT(r.out, Not(HasSubstr(library))) << r;
}
#endif

#ifdef RNNC_COMPILER_HAS_STATIC_LLVM
// A compile loads the compiler library with the parts of LLVM it uses linked in, and its own C++
// runtime, never the shared libLLVM (whose loading was most of a first compile:
// codegen/CMakeLists.txt) nor the shared libstdc++ (the tool has its own too). The
// dynamic loader names every object it maps (LD_DEBUG=files, on stderr).
TEST_F(ToolTest, ACompileLoadsTheCompilerLibraryWithoutTheSharedLibLLVM) {
  ToolResult r = run(
      {"compile", "rnn_tanh", "--size", "input_size=4", "--size", "hidden_size=4", "--emit=asm"},
      "export LD_DEBUG=files RNNC_NO_CACHE=1; ");
  ASSERT_EQ(r.exitCode, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("rnnc_run")) << r.out;
  EXPECT_THAT(r.err, HasSubstr("librnnc_compiler.so")) << r.err;
  for (const char* library :
       {"libLLVM", "libz3", "libxml2", "libffi", "libedit", "libstdc++", "libgcc_s"})
    EXPECT_THAT(r.err, Not(HasSubstr(library))) << r.err;
}
#endif

TEST_F(ToolTest, HelpListsTheSubcommands) {
  ToolResult r = run({"--help"});
  ASSERT_EQ(r.exitCode, 0) << r;
  for (const char* sub : {"run", "dump", "bench", "version"})
    EXPECT_THAT(r.out, HasSubstr(sub)) << r;
}

TEST_F(ToolTest, EachSubcommandHasHelpListingItsOptions) {
  struct Case {
    std::string subcommand;
    std::vector<std::string> options;
  };
  const std::vector<Case> cases = {
      {"run",
       {"--cell", "--weights", "--input", "--output", "--h0", "--c0", "--hn", "--cn", "--state",
        "--final", "--size", "--train", "--seed"}},
      {"dump", {"cell", "--size"}},
      {"bench",
       {"--cell", "--seq", "--batch", "--input", "--hidden", "--size", "--repeat", "--warmup"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.subcommand);
    ToolResult r = run({c.subcommand, "--help"});
    ASSERT_EQ(r.exitCode, 0) << r;
    for (const std::string& option : c.options)
      EXPECT_THAT(r.out, HasSubstr(option)) << r;
  }
}

TEST_F(ToolTest, NoSubcommandIsAnError) {
  ToolResult r = run({});
  EXPECT_NE(r.exitCode, 0) << r;
  EXPECT_LT(r.exitCode, 128) << "killed by a signal rather than a usage error" << r;
  EXPECT_THAT(r.err, HasSubstr("subcommand")) << r;
}

// ---- dump --------------------------------------------------------------------------------------

TEST_F(ToolTest, DumpPrintsTheIR) {
  ToolResult r = run({"dump", "lstm"});
  ASSERT_EQ(r.exitCode, 0) << r;
  EXPECT_THAT(r.out, StartsWith("cell @lstm(input_size, hidden_size)")) << r;
  EXPECT_THAT(r.out, HasSubstr("[B, 4*hidden_size]")) << r;
  EXPECT_EQ(r.err, "");
}

TEST_F(ToolTest, DumpWithSizesShowsConcreteShapes) {
  ToolResult r = run({"dump", "lstm", "--size", "hidden_size=8", "--size", "input_size=3"});
  ASSERT_EQ(r.exitCode, 0) << r;
  EXPECT_THAT(r.out, StartsWith("cell @lstm(input_size = 3, hidden_size = 8)")) << r;
  EXPECT_THAT(r.out, HasSubstr("[B, 32]")) << r;
  EXPECT_THAT(r.out, Not(HasSubstr("hidden_size]"))) << r;
}

// `rnnc compile`: the optimised IR on stdout and the per-pass log on stderr, as opt does.
TEST_F(ToolTest, CompilePrintsTheIRAfterEveryPassToStderr) {
  ToolResult r = run({"compile", "lstm", "--print-after-all"});
  ASSERT_EQ(r.exitCode, 0) << r;
  for (const char* pass : {"simplify", "premultiply", "merge-gates", "fuse"})
    EXPECT_THAT(r.err, HasSubstr(std::string("// ----- IR after ") + pass)) << r;
  // The input product has left the loop, leading the kernel that adds the biases; the
  // recurrent one leads the step's one fused kernel.
  EXPECT_THAT(r.out, HasSubstr("pre {\n    fused {\n      %0 = linear %x, %weight_ih")) << r;
  EXPECT_THAT(r.out, HasSubstr("step {\n    fused {\n      %4 = linear %h, %weight_hh")) << r;
}

// `rnnc compile --train` shows the cell as a training run has it: a recurrent weight's dropout
// (parameters alone) is the weight times a mask parameter, and with --grad the backward reads
// the weight made of them; inference (no --train) leaves the dropout, the identity.
TEST_F(ToolTest, CompileTrainShowsAWeightsDropoutAsAMaskParameter) {
  {
    std::ofstream file(path("weightdrop.cell"));
    file << R"(cell weightdrop(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size]
  h2 = tanh(linear(x, w) + linear(h, dropout(u, 0.5)))
  return h = h2; output h2
})";
  }
  ToolResult train = run({"compile", path("weightdrop.cell"), "--train", "--emit=ir"});
  ASSERT_EQ(train.exitCode, 0) << train;
  EXPECT_THAT(train.out, HasSubstr("param %dropout_mask.0 : [hidden_size, hidden_size]")) << train;
  EXPECT_THAT(train.out, HasSubstr("mul %u, %dropout_mask.0")) << train;
  EXPECT_THAT(train.out, Not(HasSubstr("dropout %u"))) << train;
  ToolResult grad = run({"compile", path("weightdrop.cell"), "--train", "--grad", "--emit=ir"});
  ASSERT_EQ(grad.exitCode, 0) << grad;
  EXPECT_THAT(grad.out, HasSubstr("mul %u, %dropout_mask.0")) << grad;
  ToolResult inference = run({"compile", path("weightdrop.cell"), "--emit=ir"});
  ASSERT_EQ(inference.exitCode, 0) << inference;
  EXPECT_THAT(inference.out, HasSubstr("dropout %u {p = 0.5}")) << inference;
}

// `--time-passes`: every pass and every part of LLVM's work with its milliseconds, then each
// module's (the setup part, the time loop, the outlined tiles), on stderr (stdout stays the
// stage asked for).
TEST_F(ToolTest, CompileTimePasses) {
  ToolResult r = run({"compile", "gru", "--size", "input_size=8", "--size", "hidden_size=8",
                      "--emit=asm", "--time-passes"});
  ASSERT_EQ(r.exitCode, 0) << r;
  for (const char* part :
       {"pass simplify", "pass premultiply", "pass fuse-matmul", "rnnc passes in all",
        "storage plan", "emit LLVM IR", "LLVM optimiser", "LLVM back end", "in all",
        "module rnnc_run\\.setup \\(setup and tile walks\\)", "module rnnc_run \\(time loop\\)"})
    EXPECT_THAT(r.err, testing::ContainsRegex(std::string("[0-9]+\\.[0-9]{3}  ") + part)) << r;
  // The wall time of the modules compiled side by side: at least the longest module's work (on
  // whatever cores), at most all of them one after the other plus the threads' start.
  std::smatch wall;
  ASSERT_TRUE(std::regex_search(r.err, wall, std::regex("([0-9]+\\.[0-9]{3})  wall: the modules")))
      << r;
  double longest = 0, sum = 0;
  const std::regex moduleLine("([0-9]+\\.[0-9]{3})  module ");
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), moduleLine);
       it != std::sregex_iterator(); ++it) {
    longest = std::max(longest, std::stod((*it)[1]));
    sum += std::stod((*it)[1]);
  }
  EXPECT_GE(std::stod(wall[1]), longest * 0.999) << r;
  EXPECT_LE(std::stod(wall[1]), sum + 50.0) << r;
  EXPECT_THAT(r.out, Not(HasSubstr("LLVM back end"))) << r;
  ToolResult ir = run({"compile", "gru", "--time-passes"});
  ASSERT_EQ(ir.exitCode, 0) << ir;
  EXPECT_THAT(ir.err, HasSubstr("rnnc passes in all")) << ir;
  EXPECT_THAT(ir.err, Not(HasSubstr("LLVM"))) << ir;
}

// The AVX-512 kernels can be read on a machine without AVX-512, and AVX2 ones on one with it.
TEST_F(ToolTest, CompileForANamedCpu) {
  std::vector<std::string> args = {"compile", "lstm",           "--size",     "input_size=64",
                                   "--size",  "hidden_size=64", "--emit=asm", "--target-cpu"};
  args.push_back("skylake-avx512");
  ToolResult avx512 = run(args);
  ASSERT_EQ(avx512.exitCode, 0) << avx512.err;
  EXPECT_THAT(avx512.out, testing::ContainsRegex("vfmadd[0-9]+ps[^\n]*zmm"));
  args.back() = "haswell";
  ToolResult avx2 = run(args);
  ASSERT_EQ(avx2.exitCode, 0) << avx2.err;
  EXPECT_THAT(avx2.out, testing::ContainsRegex("vfmadd[0-9]+ps[^\n]*ymm"));
  EXPECT_THAT(avx2.out, Not(HasSubstr("zmm")));
}

// The GPU's kernels: PTX for sm_80 and sm_90 with the grid kernels as entries, the NVVM IR with
// them marked as kernels; options that do not go together are errors.
TEST_F(ToolTest, CompileForNvptx) {
  for (const char* sm : {"sm_80", "sm_90"}) {
    ToolResult ptx = run({"compile", "lstm", "--size", "input_size=16", "--size", "hidden_size=24",
                          "--target", "nvptx", "--gpu", sm, "--emit=ptx"});
    ASSERT_EQ(ptx.exitCode, 0) << ptx;
    EXPECT_THAT(ptx.out, HasSubstr(std::string(".target ") + sm)) << ptx;
    EXPECT_THAT(ptx.out, HasSubstr(".visible .entry rnnc_kernel_0(")) << ptx;
    EXPECT_THAT(ptx.out, HasSubstr(".visible .entry rnnc_steps(")) << ptx;
    EXPECT_THAT(ptx.out, HasSubstr("fma.rn.f32")) << ptx;
  }
  ToolResult llvm = run({"compile", "gru", "--size", "input_size=16", "--size", "hidden_size=24",
                         "--target", "nvptx", "--emit=llvm"});
  ASSERT_EQ(llvm.exitCode, 0) << llvm;
  EXPECT_THAT(llvm.out, HasSubstr("target triple = \"nvptx64-nvidia-cuda\"")) << llvm;
  EXPECT_THAT(llvm.out, HasSubstr("!nvvm.annotations")) << llvm;
  EXPECT_THAT(llvm.out, HasSubstr("@llvm.nvvm.read.ptx.sreg.tid.x")) << llvm;
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"compile", "lstm", "--size", "input_size=4", "--size",
                                 "hidden_size=4", "--emit=ptx"},
        std::vector<std::string>{"compile", "lstm", "--size", "input_size=4", "--size",
                                 "hidden_size=4", "--target", "nvptx", "--gpu", "sm_70",
                                 "--emit=ptx"},
        std::vector<std::string>{"compile", "lstm", "--size", "input_size=4", "--size",
                                 "hidden_size=4", "--target", "nvptx", "--emit=ptx",
                                 "--weights-dtype", "int8"}}) {
    ToolResult r = run(bad);
    EXPECT_NE(r.exitCode, 0) << r;
    EXPECT_THAT(r.err, HasSubstr("rnnc: error:")) << r;
  }
}

// `rnnc run --device cuda`: without a GPU a clear error and a non-zero exit; the GPU's kernels
// emulated on this CPU give PyTorch's results for a stacked bidirectional GRU with lengths.
TEST_F(ToolTest, RunOnTheGpuOrItsEmulation) {
  const std::string dir = test::kLayerFixtures + "gru_l3_bi_bf_len/";
  std::vector<std::string> args = {"run",
                                   "--cell",
                                   "gru",
                                   "--weights",
                                   dir + "weights.safetensors",
                                   "--input",
                                   dir + "input.npy",
                                   "--h0",
                                   dir + "h0.npy",
                                   "--lengths",
                                   dir + "lengths.npy",
                                   "--batch-first",
                                   "--output",
                                   path("y.npy"),
                                   "--hn",
                                   path("hn.npy"),
                                   "--device"};
  args.push_back("cuda-emulated");
  ToolResult emulated = run(args);
  ASSERT_EQ(emulated.exitCode, 0) << emulated;
  EXPECT_LE(test::maxAbsDiff(readNpyFloat32(path("y.npy")), readNpyFloat32(dir + "output.npy")),
            1e-5f);
  EXPECT_LE(test::maxAbsDiff(readNpyFloat32(path("hn.npy")), readNpyFloat32(dir + "hn.npy")),
            1e-5f);
  if (CudaDriver::unavailableReason().empty())
    return; // a GPU is here: tests/test_gpu.cpp runs the cells on it
  args.back() = "cuda";
  ToolResult device = run(args);
  EXPECT_NE(device.exitCode, 0) << device;
  EXPECT_THAT(device.err, HasSubstr("rnnc: error: " + CudaDriver::unavailableReason())) << device;
  args.push_back("--interpret");
  ToolResult both = run(args);
  EXPECT_NE(both.exitCode, 0) << both;
  EXPECT_THAT(both.err, HasSubstr("--interpret runs on the CPU")) << both;
}

// `rnnc cache`: a second run hits what the first stored; ls names the cell and target and says
// which entry is corrupt; stats counts the lookups of every process; clear empties it.
TEST_F(ToolTest, CacheLsStatsClear) {
  const std::string fixture = std::string(RNNC_SOURCE_DIR) + "/tests/fixtures/lstm_small/";
  const std::string env = "export RNNC_CACHE_DIR='" + (dir_ / "cache").string() + "'; ";
  const std::vector<std::string> runLstm = {"run",
                                            "--cell",
                                            "lstm",
                                            "--weights",
                                            fixture + "weights.safetensors",
                                            "--input",
                                            fixture + "input.npy",
                                            "--output",
                                            "y.npy"};
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(run(runLstm, env).exitCode, 0);
  ToolResult stats = run({"cache", "stats"}, env);
  ASSERT_EQ(stats.exitCode, 0) << stats;
  EXPECT_THAT(stats.out, HasSubstr("directory: " + (dir_ / "cache").string())) << stats;
  EXPECT_THAT(stats.out, HasSubstr("entries:   1\n")) << stats;
  EXPECT_THAT(stats.out, HasSubstr("1 hits, 1 misses (50% hits)")) << stats;
  ToolResult ls = run({"cache", "ls"}, env);
  ASSERT_EQ(ls.exitCode, 0) << ls;
  EXPECT_THAT(ls.out, testing::ContainsRegex("lstm\\(input_size = [0-9]+, hidden_size = [0-9]+\\) "
                                             "for [a-z0-9_-]+, fp32 weights"))
      << ls;
  EXPECT_THAT(ls.out, HasSubstr("1 entries")) << ls;
  // Corrupt the entry: ls says so (the next lookup deletes and rebuilds it).
  for (const auto& e : fs::directory_iterator(dir_ / "cache"))
    if (e.path().extension() == ".o") {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put('\x5a');
    }
  ls = run({"cache", "ls"}, env);
  EXPECT_THAT(ls.out, HasSubstr("corrupt")) << ls;
  // The host's target, remembered beside the code (runtime/exec/TargetMemo.h): not an entry
  // of ls or stats, but cleared with them.
  auto targetFiles = [&] {
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir_ / "cache"))
      files += e.path().extension() == ".target";
    return files;
  };
  EXPECT_EQ(targetFiles(), 1);
  ToolResult clear = run({"cache", "clear"}, env);
  ASSERT_EQ(clear.exitCode, 0) << clear;
  EXPECT_THAT(clear.out, HasSubstr("removed 1 entries")) << clear;
  EXPECT_EQ(targetFiles(), 0);
  stats = run({"cache", "stats"}, env);
  EXPECT_THAT(stats.out, HasSubstr("entries:   0\n")) << stats;
  EXPECT_THAT(stats.out, HasSubstr("0 hits, 0 misses")) << stats;
  ToolResult bad = run({"cache", "list"}, env);
  EXPECT_NE(bad.exitCode, 0) << bad;
}

// `rnnc bench --eltwise --json` prints one JSON object (not the table); tiny shapes show their
// work in a unit that is not 0.000.
TEST_F(ToolTest, BenchEltwiseJsonAndSmallWorkUnits) {
  ToolResult eltwise =
      run({"bench", "--eltwise", "--json", "--batch", "2", "--hidden", "8", "--repeat", "1"});
  ASSERT_EQ(eltwise.exitCode, 0) << eltwise;
  nlohmann::json report = nlohmann::json::parse(eltwise.out);
  EXPECT_EQ(report["benchmark"], "rnn_eltwise");
  EXPECT_GT(report["paths"]["jit"]["us_per_step"].get<double>(), 0) << eltwise;
  EXPECT_GT(report["paths"]["interpreter"]["gb_per_s"].get<double>(), 0) << eltwise;
  EXPECT_GT(report["triad_gb_per_s"].get<double>(), 0) << eltwise;
  ToolResult small = run({"bench", "--seq", "2", "--batch", "2", "--input", "4", "--hidden", "4",
                          "--repeat", "1", "--jit-only"});
  ASSERT_EQ(small.exitCode, 0) << small;
  // 2 * T * B * 4H * (I + H) = 2 * 2 * 2 * 16 * 8
  EXPECT_THAT(small.out, HasSubstr("matrix-product work: 1.024 kFLOP per sequence")) << small;
}

// `rnnc bench` on tiny sizes: every path runs, and the JSON report has them all.
TEST_F(ToolTest, BenchRunsEveryPathAndReportsThemAsJson) {
  ToolResult r = run({"bench", "--seq", "3", "--batch", "2", "--input", "4", "--hidden", "5",
                      "--repeat", "3", "--json"});
  ASSERT_EQ(r.exitCode, 0) << r;
  for (const char* key : {"\"interpreter\"", "\"jit\"", "\"jit_no_premul\"",
                          "\"jit_no_fuse_matmul\"", "\"variable_length\"", "\"compile_ms\""})
    EXPECT_THAT(r.out, HasSubstr(key)) << r;
  // Each path's median, extremes and mean (the throughput of back-to-back calls).
  nlohmann::json report = nlohmann::json::parse(r.out);
  for (const auto& [name, timing] : report["paths"].items()) {
    const double min = timing["min_ms"], max = timing["max_ms"];
    EXPECT_GT(min, 0.0) << name;
    EXPECT_LE(min, timing["median_ms"].get<double>()) << name;
    EXPECT_LE(timing["median_ms"].get<double>(), max) << name;
    EXPECT_LE(min, timing["mean_ms"].get<double>()) << name;
    EXPECT_LE(timing["mean_ms"].get<double>(), max) << name;
  }
}

// `rnnc bench --json --weights-dtype bf16` on a small LSTM, with --backward when `training`.
std::vector<std::string> bf16BenchArgs(bool training) {
  std::vector<std::string> args = {
      "bench", "--seq",    "3", "--batch",    "2",      "--input",         "4",   "--hidden",
      "5",     "--repeat", "1", "--jit-only", "--json", "--weights-dtype", "bf16"};
  if (training)
    args.push_back("--backward");
  return args;
}

// Its report: the fp32 path and the bf16 one timed, and the bf16 error against fp32 (of the
// output, or of the gradients) above zero (the weights were reduced) and below `bound`.
void expectBf16BenchReport(const ToolResult& bench, bool training, double bound) {
  ASSERT_EQ(bench.exitCode, 0) << bench;
  nlohmann::json report = nlohmann::json::parse(bench.out);
  const std::string path = training ? "train_jit" : "jit";
  EXPECT_TRUE(report["paths"].contains(path)) << bench;
  EXPECT_TRUE(report["paths"].contains(path + "_bf16")) << bench;
  EXPECT_EQ(report["weights_dtype"]["dtype"], "bf16");
  EXPECT_EQ(report["weights_dtype"]["compared"], training ? "gradients" : "output");
  const double error = report["weights_dtype"]["max_abs_error_relative"];
  EXPECT_GT(error, 0.0) << "the weights were not reduced";
  EXPECT_LT(error, bound);
  EXPECT_GE(report["weights_dtype"]["mean_abs_error"].get<double>(), 0.0);
  EXPECT_GT(report["weights_dtype"]["speedup_over_fp32"].get<double>(), 0.0);
}

// `--weights-dtype`: bench times the reduced weights beside fp32 and reports their error; run
// writes outputs within the issue's 1e-2 of PyTorch's fp32 ones; compile shows the widening
// (F16C's vcvtph2ps for fp16).
TEST_F(ToolTest, WeightsDtypeOnBenchRunAndCompile) {
  expectBf16BenchReport(run(bf16BenchArgs(/*training=*/false)), false, 1e-2);

  ToolResult out =
      run({"run", "--cell", "lstm", "--weights", fixtureFile("lstm_small", "weights.safetensors"),
           "--input", fixtureFile("lstm_small", "input.npy"), "--h0",
           fixtureFile("lstm_small", "h0.npy"), "--c0", fixtureFile("lstm_small", "c0.npy"),
           "--output", "y.npy", "--weights-dtype", "fp16"});
  ASSERT_EQ(out.exitCode, 0) << out;
  Tensor expected = readNpyFloat32(fixtureFile("lstm_small", "output.npy"));
  Tensor actual = readNpyFloat32(path("y.npy"));
  ASSERT_EQ(actual.shape(), expected.shape());
  float largest = 0, worst = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    largest = std::max(largest, std::fabs(expected.data()[i]));
    worst = test::worseOf(worst, std::fabs(expected.data()[i] - actual.data()[i]));
  }
  const float runError = worst / largest;
  EXPECT_GT(runError, 0.0f) << "the weights were not reduced";
  EXPECT_LT(runError, 1e-2f);

  // The interpreter rounds its products as the JIT does: the same output, to fp32's sums.
  ToolResult interpreted =
      run({"run", "--cell", "lstm", "--weights", fixtureFile("lstm_small", "weights.safetensors"),
           "--input", fixtureFile("lstm_small", "input.npy"), "--h0",
           fixtureFile("lstm_small", "h0.npy"), "--c0", fixtureFile("lstm_small", "c0.npy"),
           "--output", "y_interpreted.npy", "--weights-dtype", "fp16", "--interpret"});
  ASSERT_EQ(interpreted.exitCode, 0) << interpreted;
  EXPECT_LT(test::maxAbsDiff(readNpyFloat32(path("y_interpreted.npy")), actual), 1e-5f);

  ToolResult asm16 = run({"compile", "gru", "--size", "input_size=16", "--size", "hidden_size=16",
                          "--emit=asm", "--target-cpu", "haswell", "--weights-dtype", "fp16"});
  ASSERT_EQ(asm16.exitCode, 0) << asm16.err;
  EXPECT_THAT(asm16.out, HasSubstr("vcvtph2ps"));
  // Packed by the runtime (runtime/exec/WeightPacking.h), which the code calls.
  EXPECT_THAT(asm16.out, HasSubstr("rnnc_pack_weights"));
}

// `rnnc bench --backward --weights-dtype bf16`: mixed-precision training timed beside fp32's, and
// its gradients' error against fp32's.
TEST_F(ToolTest, BenchBackwardTimesMixedPrecisionTraining) {
  expectBf16BenchReport(run(bf16BenchArgs(/*training=*/true)), true, 2e-2);
}

// `rnnc bench --backward`: training (forward + derived backward) on every path, and the size of
// the training workspace.
TEST_F(ToolTest, BenchBackwardTimesTrainingOnEveryPath) {
  ToolResult r = run({"bench", "--backward", "--seq", "3", "--batch", "2", "--input", "4",
                      "--hidden", "5", "--repeat", "1", "--json"});
  ASSERT_EQ(r.exitCode, 0) << r;
  for (const char* key : {"\"train_interpreter\"", "\"train_jit_no_fuse\"", "\"train_jit\"",
                          "\"training_workspace_bytes\""})
    EXPECT_THAT(r.out, HasSubstr(key)) << r;
  // Beyond the input and the output (h), c and the four activated gates per step and sequence
  // (cuDNN's reserve space): 3*2*(5+4*5) floats; c alone when the backward recomputes.
  EXPECT_THAT(r.out, HasSubstr("\"training_workspace_bytes\":600")) << r;
  EXPECT_THAT(r.out, HasSubstr("\"training_workspace_bytes_recompute\":120")) << r;
}

// The timer's `prepare` runs before every call of the body, warm-up included (the training
// bench hands each forward a fresh input it may keep), and its time is not the body's.
TEST(ToolTiming, PrepareRunsUntimedBeforeEveryCall) {
  std::string calls;
  const tools::Timing timing = tools::timeRepeats(
      2, 3,
      [&] {
        calls += 'p';
        ::usleep(40000);
      },
      [&] { calls += 'b'; });
  EXPECT_EQ(calls, "pbpbpbpbpb");
  EXPECT_LT(timing.max, 40.0); // milliseconds: an empty body, not the 40 ms before it
}

TEST_F(ToolTest, BenchEltwiseReportsFusedUnfusedAndTriad) {
  ToolResult r = run({"bench", "--eltwise", "--batch", "3", "--hidden", "8", "--repeat", "1"});
  ASSERT_EQ(r.exitCode, 0) << r;
  for (const char* row : {"interpreter (unfused)", "jit (fused)", "STREAM triad, same bytes",
                          "fused speedup over unfused"})
    EXPECT_THAT(r.out, HasSubstr(row)) << r;
}

TEST_F(ToolTest, DumpReadsACellFile) {
  ToolResult r = run({"dump", (fs::path(RNNC_SOURCE_DIR) / "cells" / "gru.cell").string()});
  ASSERT_EQ(r.exitCode, 0) << r;
  EXPECT_THAT(r.out, StartsWith("cell @gru(input_size, hidden_size)")) << r;
}

// An IR dump is a cell: what `compile --emit ir-opt` prints (pre block, fused kernels, bound
// sizes) runs through `run` and `bench` and matches PyTorch as the cell it came from does.
TEST_F(ToolTest, RunAndBenchReadAnIRDump) {
  for (const char* size : {"", "hidden_size=7"}) {
    SCOPED_TRACE(size);
    std::vector<std::string> compile = {"compile", "lstm", "--emit", "ir-opt"};
    if (*size)
      compile.insert(compile.end(), {"--size", size});
    ToolResult dumped = run(compile);
    ASSERT_EQ(dumped.exitCode, 0) << dumped;
    ASSERT_THAT(dumped.out, HasSubstr("fused {")) << dumped;
    std::ofstream(path("lstm.rnnir")) << dumped.out;

    ToolResult r =
        run({"run", "--cell", path("lstm.rnnir"), "--weights",
             fixtureFile("lstm_small", "weights.safetensors"), "--input",
             fixtureFile("lstm_small", "input.npy"), "--h0", fixtureFile("lstm_small", "h0.npy"),
             "--c0", fixtureFile("lstm_small", "c0.npy"), "--output", path("out.npy"), "--hn",
             path("hn.npy"), "--cn", path("cn.npy")});
    ASSERT_EQ(r.exitCode, 0) << r;
    expectClose(path("out.npy"), fixtureFile("lstm_small", "output.npy"));
    expectClose(path("hn.npy"), fixtureFile("lstm_small", "hn.npy"));
    expectClose(path("cn.npy"), fixtureFile("lstm_small", "cn.npy"));
  }
  ToolResult bench = run({"bench", "--cell", path("lstm.rnnir"), "--seq", "3", "--batch", "2",
                          "--input", "4", "--hidden", "7", "--repeat", "1", "--json"});
  ASSERT_EQ(bench.exitCode, 0) << bench;
  EXPECT_THAT(bench.out, HasSubstr("\"jit\"")) << bench;
  ToolResult reread = run({"compile", path("lstm.rnnir"), "--emit", "ir"});
  ASSERT_EQ(reread.exitCode, 0) << reread;
  EXPECT_EQ(reread.out, readBytes(path("lstm.rnnir")));
}

// ---- Bad input: exit status 1 and a message with the key facts ---------------------------------

// The arguments of a valid `rnnc run` on lstm_small, with any of them replaced.
struct RunArgs {
  std::string cell = "lstm";
  std::string weights = fixtureFile("lstm_small", "weights.safetensors");
  std::string input = fixtureFile("lstm_small", "input.npy");
  std::vector<std::string> extra;
  std::vector<std::string> args(const std::string& output) const {
    std::vector<std::string> out = {"run",     "--cell", cell,       "--weights", weights,
                                    "--input", input,    "--output", output};
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  }
};

class ToolErrorTest : public ToolTest {
protected:
  void expectRunError(const RunArgs& a, std::initializer_list<std::string> fragments) const {
    expectError(a.args(path("out.npy")), fragments);
    EXPECT_FALSE(fs::exists(path("out.npy"))) << "no output is written on error";
  }

  // lstm_small's weights with `edit` applied, written to a file in the scratch directory.
  template <class Edit> std::string editedWeights(Edit edit) const {
    TensorMap weights = readSafeTensors(fixtureFile("lstm_small", "weights.safetensors"));
    edit(weights);
    std::string p = path("weights.safetensors");
    writeSafeTensors(p, weights);
    return p;
  }
};

TEST_F(ToolErrorTest, CompileForAnUnknownCpuListsTheKnownOnes) {
  expectError({"compile", "lstm", "--size", "input_size=4", "--size", "hidden_size=4", "--emit=asm",
               "--target-cpu", "skylake-avx51"},
              {"unknown x86-64 CPU 'skylake-avx51'", "skylake-avx512", "znver3"});
}

TEST_F(ToolErrorTest, CompileToAssemblyNeedsEverySize) {
  expectError({"compile", "lstm", "--size", "input_size=4", "--emit=asm"},
              {"give size 'hidden_size' with --size hidden_size=VALUE"});
}

TEST_F(ToolErrorTest, BenchEltwiseWithoutRepeatsOrRows) {
  expectError({"bench", "--eltwise", "--repeat", "0"}, {"--repeat must be positive"});
  expectError({"bench", "--eltwise", "--batch", "0"}, {"--batch", "must be positive"});
}

TEST_F(ToolErrorTest, UnknownCellNameListsTheBuiltins) {
  RunArgs a;
  a.cell = "lsmt";
  expectRunError(a, {"unknown cell 'lsmt'",
                     "gru, lnlstm, lstm, lstm_proj, peephole_lstm, rnn_relu, rnn_tanh"});
}

TEST_F(ToolErrorTest, MissingWeightsFile) {
  RunArgs a;
  a.weights = path("nope.safetensors");
  expectRunError(a, {a.weights + ": cannot open file", "No such file or directory"});
}

TEST_F(ToolErrorTest, TruncatedWeightsFile) {
  std::string bytes = readBytes(fixtureFile("lstm_small", "weights.safetensors"));
  RunArgs a;
  a.weights = path("truncated.safetensors");
  writeBytes(a.weights, bytes.substr(0, bytes.size() / 2));
  expectRunError(a, {a.weights + ": ", "truncated"});
}

TEST_F(ToolErrorTest, WeightsMissingATensorNameTheParameter) {
  RunArgs a;
  a.weights = editedWeights([](TensorMap& w) { w.erase("bias_hh_l0"); });
  expectRunError(a, {a.weights + ": ", "no tensor for parameter 'bias_hh'", "'bias_hh_l0'",
                     "the file has: bias_ih_l0, weight_hh_l0, weight_ih_l0"});
}

TEST_F(ToolErrorTest, WeightWithTheWrongShapeNamesBothShapes) {
  RunArgs a;
  a.weights = editedWeights([](TensorMap& w) { w["weight_hh_l0"] = Tensor({28, 6}); });
  expectRunError(a, {"tensor 'weight_hh_l0' has shape [28, 6]",
                     "expected [4*hidden_size, hidden_size] = [28, 7]"});
}

TEST_F(ToolErrorTest, AnIncompleteSecondLayerNamesTheMissingTensor) {
  RunArgs a;
  a.weights = editedWeights([](TensorMap& w) { w["weight_ih_l1"] = Tensor({28, 7}); });
  expectRunError(a, {a.weights + ": no tensor for parameter 'weight_hh' of cell 'lstm' (looked "
                                 "for 'weight_hh_l1')"});
}

TEST_F(ToolErrorTest, InputOfRank2) {
  RunArgs a;
  a.input = path("x.npy");
  writeNpy(a.input, Tensor({4, 5}));
  expectRunError(
      a, {"input (" + a.input + ") has shape [4, 5], expected [T, B, input_size] (rank 3)"});
}

TEST_F(ToolErrorTest, InputWithTheWrongFeatureSizeNamesBothShapes) {
  RunArgs a;
  a.input = path("x.npy");
  writeNpy(a.input, Tensor({4, 3, 6}));
  expectRunError(a, {"input (" + a.input + ") has shape [4, 3, 6]",
                     "expected [T, B, input_size] = [4, 3, 5]", "input_size = 5 from",
                     "tensor 'weight_ih_l0'"});
}

TEST_F(ToolErrorTest, InitialStateWithTheWrongFeatureSize) {
  RunArgs a;
  a.extra = {"--h0", path("h0.npy")};
  writeNpy(path("h0.npy"), Tensor({1, 3, 6}));
  expectRunError(a, {"initial state 'h' (" + path("h0.npy") + ") has shape [1, 3, 6]",
                     "expected [num_layers * num_directions, B, hidden_size] = [1, 3, 7]"});
}

TEST_F(ToolErrorTest, InitialStateWithTheWrongBatch) {
  RunArgs a;
  a.extra = {"--h0", path("h0.npy")};
  writeNpy(path("h0.npy"), Tensor({1, 2, 7}));
  expectRunError(a, {"initial state 'h' (" + path("h0.npy") +
                     ") has shape [1, 2, 7], expected "
                     "[num_layers * num_directions, B, hidden_size] = [1, 3, 7]"});
}

TEST_F(ToolErrorTest, LengthsOfTheWrongShapeOrRangeNameTheirFile) {
  RunArgs a;
  a.extra = {"--lengths", path("lengths.npy")};
  writeNpy(path("lengths.npy"), Int64Array{{2}, {4, 4}});
  expectRunError(a, {"lengths (" + path("lengths.npy") + ") has shape [2], expected [B] = [3]"});
  writeNpy(path("lengths.npy"), Int64Array{{3}, {4, 9, 1}});
  expectRunError(
      a, {"lengths[1] = 9 (" + path("lengths.npy") + ") is out of range", "[1, T] = [1, 4]"});
}

TEST_F(ToolErrorTest, CellStateForGru) {
  RunArgs a;
  a.cell = "gru";
  a.weights = fixtureFile("gru_small", "weights.safetensors");
  a.input = fixtureFile("gru_small", "input.npy");
  a.extra = {"--c0", fixtureFile("lstm_small", "c0.npy")};
  expectRunError(a, {"--c0", "cell 'gru' has no state 'c'", "its states: h"});
}

TEST_F(ToolErrorTest, Float64Input) {
  // np.save of np.zeros((4, 3, 5)) as float64, byte for byte.
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 3, 5), }";
  while ((10 + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header + std::string(4 * 3 * 5 * sizeof(double), '\0');
  RunArgs a;
  a.input = path("x64.npy");
  writeBytes(a.input, bytes);
  expectRunError(a, {a.input + ": ", "float64", "expected '<f4' (float32)"});
}

TEST_F(ToolErrorTest, WeightsDtypesThatCannotRun) {
  RunArgs a;
  a.extra = {"--weights-dtype", "fp8"};
  expectRunError(a, {"unknown weights dtype 'fp8': expected fp32, bf16, fp16 or int8"});
  a.extra = {"--weights-dtype", "int8", "--train"};
  expectRunError(a, {"int8 weights are for inference: train in fp32, bf16 or fp16"});
  expectError({"bench", "--backward", "--weights-dtype", "int8"},
              {"--weights-dtype int8 times inference: training takes fp32, bf16 or fp16"});
}

TEST_F(ToolErrorTest, ZeroSize) {
  RunArgs a;
  a.extra = {"--size", "hidden_size=0"};
  expectRunError(a, {"--size hidden_size", "'0' is not a positive integer"});
  expectError({"dump", "lstm", "--size", "hidden_size=0"},
              {"--size hidden_size", "'0' is not a positive integer"});
}

TEST_F(ToolErrorTest, SizeWithoutEquals) {
  RunArgs a;
  a.extra = {"--size", "foo"};
  expectRunError(a, {"--size expects NAME=VALUE", "'foo'"});
  expectError({"dump", "lstm", "--size", "foo"}, {"--size expects NAME=VALUE", "'foo'"});
}

TEST_F(ToolErrorTest, CellFileWithASyntaxErrorGivesFileLineColumn) {
  std::string cellFile = path("typo.cell");
  writeBytes(cellFile, "cell typo(n) {\n"
                       "  input x[n]\n"
                       "  state h[n]\n"
                       "  h2 = tanh(x + h))\n"
                       "  return h = h2; output h2\n"
                       "}\n");
  RunArgs runArgs;
  runArgs.cell = cellFile;
  for (const auto& args :
       {std::vector<std::string>{"dump", cellFile}, runArgs.args(path("o.npy"))}) {
    SCOPED_TRACE(args[0]);
    ToolResult r = run(args);
    EXPECT_EQ(r.exitCode, 1) << r;
    // A located error starts with the location, without the tool's own `rnnc: error:` prefix.
    EXPECT_THAT(r.err, StartsWith(cellFile + ":4:19: error: expected a statement")) << r;
    EXPECT_THAT(r.err, HasSubstr("  h2 = tanh(x + h))\n")) << r;
    EXPECT_THAT(r.err, HasSubstr("\n" + std::string(2 + 18, ' ') + "^\n")) << r;
  }
}

TEST_F(ToolErrorTest, IRFileWithAnErrorGivesFileLineColumn) {
  std::ofstream(path("bad.rnnir")) << "cell @c(n) {\n  input %x : [B, n]\n  state %h : [B, n]\n"
                                      "  step {\n    %0 = tanh %x, %h : [B, n]\n  }\n"
                                      "  yield %h = %0\n  output %0\n}\n";
  RunArgs a;
  a.cell = path("bad.rnnir");
  expectRunError(a, {path("bad.rnnir") + ":5:"});
}

TEST_F(ToolErrorTest, DumpOfAMissingCellFile) {
  std::string missing = path("missing.cell");
  expectError({"dump", missing},
              {missing + ": cannot open cell file", "No such file or directory"});
}

TEST_F(ToolErrorTest, DumpOfAnUnknownName) {
  expectError({"dump", "nothere"}, {"unknown cell 'nothere'", "lstm"});
}

} // namespace
} // namespace rnnc
