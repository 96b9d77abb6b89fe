// Reading torch.save archives (runtime/data/TorchCheckpoint.h) against the values PyTorch put in
// them: tests/fixtures/torch_save/ holds each archive and, beside it, the float32 tensors it must
// give, written as safetensors by the script that saved it (make_torch_save_fixtures.py).
#include "rnnc/rnnc.h"
#include "runtime/data/Npy.h"
#include "runtime/data/TorchCheckpoint.h"
#include "runtime/data/WeightFile.h"
#include "runtime/data/ZipArchive.h"
#include "tests/TestSupport.h"
#include "tests/ToolRunner.h"

#include <random>

namespace rnnc {
namespace {

const std::string kTorchSave = std::string(RNNC_SOURCE_DIR) + "/tests/fixtures/torch_save/";

class TorchCheckpointTest : public test::ScratchDirTest {};

void expectSameTensors(const TensorMap& read, const TensorMap& expected) {
  std::vector<std::string> readNames, expectedNames;
  for (const auto& [name, tensor] : read)
    readNames.push_back(name);
  for (const auto& [name, tensor] : expected)
    expectedNames.push_back(name);
  ASSERT_EQ(readNames, expectedNames);
  for (const auto& [name, tensor] : expected) {
    const Tensor& got = read.at(name);
    ASSERT_EQ(got.shape(), tensor.shape()) << name;
    for (int64_t i = 0; i < tensor.numel(); ++i) // converted exactly as torch's .float()
      ASSERT_EQ(got.data()[i], tensor.data()[i]) << name << " element " << i;
  }
}

TEST_F(TorchCheckpointTest, AStateDictGivesEveryTensorByItsName) {
  expectSameTensors(readWeightFile(kTorchSave + "lstm_state_dict.pt"),
                    readSafeTensors(kTorchSave + "lstm_state_dict.expected.safetensors"));
}

TEST_F(TorchCheckpointTest, ACheckpointGivesItsFloatTensorsNamedByTheirPathAndSkipsTheRest) {
  // model.*, optimizer.state.N.momentum_buffer; not the epoch, the argparse.Namespace, the
  // optimiser's settings or the int64 step.
  expectSameTensors(readWeightFile(kTorchSave + "checkpoint.pt"),
                    readSafeTensors(kTorchSave + "checkpoint.expected.safetensors"));
}

TEST_F(TorchCheckpointTest, StridedViewsSharedStoragesAndOtherFloatTypesAreConverted) {
  expectSameTensors(readWeightFile(kTorchSave + "layouts.pt"),
                    readSafeTensors(kTorchSave + "layouts.expected.safetensors"));
}

TEST_F(TorchCheckpointTest, WhatIsNotAStateDictIsRefusedSayingWhatToSaveInstead) {
  const std::pair<const char*, const char*> cases[] = {
      {"whole_module.pt", "holds a pickled torch.nn.modules.rnn.GRU"},
      {"legacy.pt", "legacy format"},
      {"scripted.pt", "TorchScript archive"},
      {"one_tensor.pt", "holds one tensor, not a state_dict"},
      {"compressed.pt", "is compressed"}};
  for (const auto& [file, message] : cases) {
    const std::string p = kTorchSave + file;
    expectError(p, [&] { readWeightFile(p); }, {message});
  }
}

TEST_F(TorchCheckpointTest, ALayerFromAStateDictRunsAsFromItsSafetensors) {
  LayerSpec spec;
  Layer fromTorch = Layer::fromFile(spec, kTorchSave + "lstm_state_dict.pt");
  Layer fromSafetensors =
      Layer::fromFile(spec, kTorchSave + "lstm_state_dict.expected.safetensors");
  const int64_t steps = 5, batch = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(steps * batch * fromTorch.inputSize()));
  for (float& v : x)
    v = normal(rng);
  const size_t outputs = static_cast<size_t>(steps * batch * fromTorch.outputSize());
  std::vector<float> a(outputs), b(outputs);
  fromTorch.forward(x.data(), steps, batch, nullptr, nullptr, nullptr, a.data(), nullptr, nullptr);
  fromSafetensors.forward(x.data(), steps, batch, nullptr, nullptr, nullptr, b.data(), nullptr,
                          nullptr);
  EXPECT_EQ(a, b);
}

TEST_F(TorchCheckpointTest, TheToolRunsACheckpointsModelSelectedByPrefix) {
  // The checkpoint's model is a GRU inside nn.Sequential: model.0.weight_ih_l0, ...; the run
  // must equal the one from the same weights as safetensors.
  test::ToolRunner tool(dir_);
  std::vector<float> x(4 * 2 * 2);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  writeNpy(path("x.npy"), Tensor({4, 2, 2}, x));
  for (const char* file : {"checkpoint.pt", "checkpoint.expected.safetensors"}) {
    test::ToolResult r = tool.run({"run", "--cell", "gru", "--weights", kTorchSave + file,
                                   "--weights-prefix", "model.0.", "--input", path("x.npy"),
                                   "--output", path(std::string(file) + ".npy")});
    ASSERT_EQ(r.exitCode, 0) << r;
  }
  const Tensor fromTorch = readNpyFloat32(path("checkpoint.pt.npy"));
  const Tensor fromSafetensors = readNpyFloat32(path("checkpoint.expected.safetensors.npy"));
  ASSERT_EQ(fromTorch.shape(), (TensorShape{4, 2, 3}));
  EXPECT_EQ(fromTorch.values(), fromSafetensors.values());
}

TEST_F(TorchCheckpointTest, WithoutAPrefixTheToolNamesTheOneThatSelectsTheLayer) {
  test::ToolRunner tool(dir_);
  writeNpy(path("x.npy"), Tensor({4, 2, 2}, 0.5f));
  test::ToolResult r = tool.run({"run", "--cell", "gru", "--weights", kTorchSave + "checkpoint.pt",
                                 "--input", path("x.npy"), "--output", path("y.npy")});
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_NE(r.err.find("is not a parameter of cell 'gru'"), std::string::npos) << r;
  EXPECT_NE(r.err.find("select the layer's tensors with --weights-prefix model.0."),
            std::string::npos)
      << r;
}

// Every prefix of an archive, and archives with bytes changed, give a UserError naming the file
// or tensors; never a crash or a read out of bounds (the sanitizer builds run this too).
TEST_F(TorchCheckpointTest, TruncatedOrCorruptedArchivesAreErrorsNotCrashes) {
  const std::string p = "lstm.pt";
  const std::string whole = readBytes(kTorchSave + "lstm_state_dict.pt");
  for (size_t length = 0; length < whole.size(); length += 97) {
    try {
      parseTorchCheckpoint(std::string_view(whole).substr(0, length), p);
      ADD_FAILURE() << "a prefix of " << length << " bytes was read";
    } catch (const UserError& e) {
      EXPECT_THAT(std::string(e.what()), testing::StartsWith(p + ": "));
    }
  }
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    std::string changed = whole;
    for (int k = 0; k < 3; ++k)
      changed[rng() % changed.size()] = static_cast<char>(rng());
    try {
      parseTorchCheckpoint(changed, p); // a change in tensor data or padding reads fine
    } catch (const UserError& e) {
      EXPECT_THAT(std::string(e.what()), testing::StartsWith(p + ": "));
    }
  }
}

TEST_F(TorchCheckpointTest, ATensorReachingPastItsStorageIsAnErrorNamingIt) {
  // The first tensor's size made larger than its storage, in the pickle itself: "weight_ih_l0"
  // is [16, 3] (BININT1 16, BININT1 3) over 48 floats; as [16, 4] it would read 64.
  std::string bytes = readBytes(kTorchSave + "lstm_state_dict.pt");
  const std::string shape("K\x10K\x03\x86", 5);
  const size_t at = bytes.find(shape);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] = 4;
  expectError("lstm.pt", [&] { parseTorchCheckpoint(bytes, "lstm.pt"); },
              {"tensor 'weight_ih_l0'", "reach past its storage of 48 elements"});
}

TEST(ZipArchive, AStoredArchiveGivesEachEntrysBytes) {
  // A stored zip of two entries, made by hand: local headers, data, central directory, end.
  auto u16 = [](unsigned v) { return std::string{char(v & 0xff), char(v >> 8)}; };
  auto u32 = [&](unsigned v) { return u16(v & 0xffff) + u16(v >> 16); };
  std::string archive, directory;
  const std::pair<std::string, std::string> files[] = {{"a/x", "hello"}, {"a/y", ""}};
  for (const auto& [name, data] : files) {
    const unsigned offset = static_cast<unsigned>(archive.size());
    archive += u32(0x04034b50) + u16(20) + u16(0) + u16(0) + u32(0) + u32(0) +
               u32(static_cast<unsigned>(data.size())) + u32(static_cast<unsigned>(data.size())) +
               u16(static_cast<unsigned>(name.size())) + u16(0) + name + data;
    directory += u32(0x02014b50) + u16(20) + u16(20) + u16(0) + u16(0) + u32(0) + u32(0) +
                 u32(static_cast<unsigned>(data.size())) + u32(static_cast<unsigned>(data.size())) +
                 u16(static_cast<unsigned>(name.size())) + u16(0) + u16(0) + u16(0) + u16(0) +
                 u32(0) + u32(offset) + name;
  }
  const unsigned start = static_cast<unsigned>(archive.size());
  archive += directory + u32(0x06054b50) + u16(0) + u16(0) + u16(2) + u16(2) +
             u32(static_cast<unsigned>(directory.size())) + u32(start) + u16(0);
  const MemorySource source(archive);
  ZipEntries entries = readZipEntries(source, "t.zip");
  ASSERT_EQ(entries.stored.size(), 2u);
  EXPECT_TRUE(entries.compressed.empty());
  const ZipEntry x = entries.stored.at("a/x"), y = entries.stored.at("a/y");
  EXPECT_EQ(source.readString(x.offset, x.size), "hello");
  EXPECT_EQ(y.size, 0u);
}

} // namespace
} // namespace rnnc

namespace rnnc {
namespace {

TEST(ZipArchive, Zip64SizesOffsetsAndCountsAreRead) {
  // One stored entry whose central record says 0xffffffff for its sizes and local header offset
  // and gives them in its ZIP64 extra field; the end record says 0xffff entries and 0xffffffff
  // for the directory, with a ZIP64 locator and end record giving them (as a zip of 4 GB or of
  // 65535 entries and more has them).
  auto le = [](uint64_t v, int bytes) {
    std::string out;
    for (int i = 0; i < bytes; ++i)
      out += static_cast<char>((v >> (8 * i)) & 0xff);
    return out;
  };
  const std::string name = "a/data/0", data = "0123456789";
  std::string archive = le(0x04034b50, 4) + le(45, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(0, 4) +
                        le(data.size(), 4) + le(data.size(), 4) + le(name.size(), 2) + le(0, 2) +
                        name + data;
  const std::string extra = le(0x0001, 2) + le(24, 2) + le(data.size(), 8) + le(data.size(), 8) +
                            le(0, 8); // uncompressed, compressed, offset
  const std::string directory = le(0x02014b50, 4) + le(45, 2) + le(45, 2) + le(0, 2) + le(0, 2) +
                                le(0, 4) + le(0, 4) + le(0xffffffffu, 4) + le(0xffffffffu, 4) +
                                le(name.size(), 2) + le(extra.size(), 2) + le(0, 2) + le(0, 2) +
                                le(0, 2) + le(0, 4) + le(0xffffffffu, 4) + name + extra;
  const uint64_t directoryAt = archive.size();
  archive += directory;
  const uint64_t zip64EndAt = archive.size();
  archive += le(0x06064b50, 4) + le(44, 8) + le(45, 2) + le(45, 2) + le(0, 4) + le(0, 4) +
             le(1, 8) + le(1, 8) + le(directory.size(), 8) + le(directoryAt, 8);
  archive += le(0x07064b50, 4) + le(0, 4) + le(zip64EndAt, 8) + le(1, 4);
  archive += le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(0xffff, 2) + le(0xffff, 2) +
             le(0xffffffffu, 4) + le(0xffffffffu, 4) + le(0, 2);
  const MemorySource source(archive);
  ZipEntries entries = readZipEntries(source, "z64.zip");
  ASSERT_EQ(entries.stored.size(), 1u);
  const ZipEntry entry = entries.stored.at(name);
  EXPECT_EQ(source.readString(entry.offset, entry.size), data);
  // The locator pointing anywhere else is an error naming the file.
  std::string broken = archive;
  broken[broken.size() - 22 - 20 + 8] ^= 1;
  EXPECT_THROW(readZipEntries(MemorySource(broken), "z64.zip"), UserError);
}

} // namespace
} // namespace rnnc
