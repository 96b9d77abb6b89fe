// Tests for runtime/data/SafeTensors: round trips, the writer's exact layout, a file as the Python
// safetensors library writes it, and one test per kind of malformed file, each checking that the
// UserError names the file (and the tensor) and the problem.
#include "runtime/data/SafeTensors.h"

#include "ir/Error.h"
#include "ir/FileIO.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/TestSupport.h"
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace rnnc {
namespace {

namespace fs = std::filesystem;
using testing::HasSubstr;
using testing::StartsWith;

class SafeTensorsTest : public test::ScratchDirTest {
protected:
  std::string writeBytes(const std::string& bytes) const {
    return ScratchDirTest::writeBytes("weights.safetensors", bytes);
  }

  // Writes a file with the given JSON header and data, and expects reading it to fail.
  void expectReadError(const std::string& json, const std::string& data,
                       std::initializer_list<std::string> fragments) {
    SCOPED_TRACE(json);
    std::string p = writeBytes(safetensorsFile(json, data));
    expectError(
        p, [&] { readSafeTensors(p); }, fragments);
  }

  static std::string u64(uint64_t value) {
    std::string out;
    for (int i = 0; i < 8; ++i)
      out += static_cast<char>((value >> (8 * i)) & 0xff);
    return out;
  }

  // A safetensors file: header padded with spaces to a multiple of 8, as the reference writer does.
  static std::string safetensorsFile(std::string json, const std::string& data) {
    while (json.size() % 8 != 0)
      json += ' ';
    return u64(json.size()) + json + data;
  }
};

std::string floatBytes(std::initializer_list<float> values) {
  std::string out;
  for (float v : values)
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  return out;
}

std::vector<float> iotaFloats(size_t n, float start) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i)
    values[i] = start + static_cast<float>(i);
  return values;
}

Tensor makeTensor(TensorShape shape, float start) {
  size_t n = static_cast<size_t>(numElements(shape));
  return Tensor(std::move(shape), iotaFloats(n, start));
}

// --- Round trips -------------------------------------------------------------------------------

TEST_F(SafeTensorsTest, RoundTripsTensorsOfEveryRank) {
  TensorMap tensors;
  tensors.emplace("scalar", makeTensor({}, 1));
  tensors.emplace("bias", makeTensor({5}, 10));
  tensors.emplace("weight_ih_l0", makeTensor({3, 4}, 20));
  tensors.emplace("cube", makeTensor({2, 3, 4}, 40));
  tensors.emplace("empty", makeTensor({0}, 0));
  tensors.emplace("empty_rows", makeTensor({0, 3}, 0));
  std::string p = path("w.safetensors");
  writeSafeTensors(p, tensors);
  TensorMap back = readSafeTensors(p);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_EQ(back.count(name), 1u);
    EXPECT_EQ(back.at(name).shape(), tensor.shape());
    EXPECT_EQ(back.at(name).values(), tensor.values());
  }
}

// A regular file is read tensor by tensor into each tensor's storage (ir/FileIO.h,
// PositionalFile), a pipe whole: the same tensors either way, large ones included.
TEST_F(SafeTensorsTest, AFileAndAPipeOfItReadTheSame) {
  TensorMap tensors;
  tensors.emplace("weight_hh_l0", makeTensor({1024, 257}, -3)); // past a 1 MB read
  tensors.emplace("bias", makeTensor({7}, 2));
  tensors.emplace("empty", makeTensor({0, 4}, 0));
  std::string p = path("w.safetensors");
  writeSafeTensors(p, tensors);
  const std::string fifo = path("pipe");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string bytes = readBytes(p);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << bytes; });
  TensorMap piped = readSafeTensors(fifo);
  writer.join();
  TensorMap read = readSafeTensors(p);
  for (const TensorMap* back : {&read, &piped}) {
    ASSERT_EQ(back->size(), tensors.size());
    for (const auto& [name, tensor] : tensors) {
      SCOPED_TRACE(name);
      EXPECT_EQ(back->at(name).shape(), tensor.shape());
      EXPECT_EQ(back->at(name).values(), tensor.values());
    }
  }
}

TEST_F(SafeTensorsTest, RoundTripsAnEmptyMap) {
  std::string p = path("w.safetensors");
  writeSafeTensors(p, {});
  EXPECT_TRUE(readSafeTensors(p).empty());
}

TEST_F(SafeTensorsTest, RoundTripsNamesThatNeedEscaping) {
  TensorMap tensors;
  tensors.emplace("a \"quoted\"\\name", makeTensor({2}, 1));
  tensors.emplace("ünïcode.weight", makeTensor({1}, 5));
  std::string p = path("w.safetensors");
  writeSafeTensors(p, tensors);
  TensorMap back = readSafeTensors(p);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back.at("a \"quoted\"\\name").values(), (TensorData{1, 2}));
  EXPECT_EQ(back.at("ünïcode.weight").values(), (TensorData{5}));
}

// --- The writer's layout -----------------------------------------------------------------------

TEST_F(SafeTensorsTest, WriterLaysOutTensorsInNameOrderWithAPaddedHeader) {
  TensorMap tensors;
  tensors.emplace("b", Tensor({2}, std::vector<float>{3, 4}));
  tensors.emplace("a", Tensor({}, std::vector<float>{7}));
  std::string p = path("w.safetensors");
  writeSafeTensors(p, tensors);

  std::string json = R"({"a":{"data_offsets":[0,4],"dtype":"F32","shape":[]},)"
                     R"("b":{"data_offsets":[4,12],"dtype":"F32","shape":[2]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  EXPECT_EQ(readBytes(p), u64(padded.size()) + padded + floatBytes({7, 3, 4}));
}

TEST_F(SafeTensorsTest, WriterRejectsTheReservedMetadataName) {
  std::string p = path("w.safetensors");
  TensorMap tensors;
  tensors.emplace("__metadata__", makeTensor({1}, 0));
  expectError(p, [&] { writeSafeTensors(p, tensors); }, {"'__metadata__'", "reserved"});
}

TEST_F(SafeTensorsTest, WriterRejectsANameThatIsNotUtf8) {
  std::string p = path("w.safetensors");
  TensorMap tensors;
  tensors.emplace("bad\xff", makeTensor({1}, 0));
  expectError(p, [&] { writeSafeTensors(p, tensors); }, {"not valid UTF-8"});
}

TEST_F(SafeTensorsTest, WriterReportsAnUnwritablePath) {
  std::string p = path("no_such_dir/w.safetensors");
  expectError(p, [&] { writeSafeTensors(p, {}); },
              {"cannot open file for writing", "No such file or directory"});
}

// --- Files as other tools write them -----------------------------------------------------------

// safetensors.torch.save_file({"weight": torch.arange(4.).reshape(2, 2), "bias": ...}): metadata
// first, keys in the order torch gives them, header padded with spaces to 8 bytes.
TEST_F(SafeTensorsTest, ReadsAFileWrittenByThePythonLibrary) {
  std::string json = R"({"__metadata__":{"format":"pt"},)"
                     R"("weight":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]},)"
                     R"("bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  TensorMap tensors =
      readSafeTensors(writeBytes(safetensorsFile(json, floatBytes({9, 8, 0, 1, 2, 3}))));
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors.at("weight").shape(), (TensorShape{2, 2}));
  EXPECT_EQ(tensors.at("weight").values(), (TensorData{0, 1, 2, 3}));
  EXPECT_EQ(tensors.at("bias").values(), (TensorData{9, 8}));
}

TEST_F(SafeTensorsTest, AllowsGapsAndUnpaddedHeaders) {
  // Nothing requires tensors to be contiguous, or the header to be padded.
  std::string json = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  std::string bytes = u64(json.size()) + json + floatBytes({-1, 6});
  TensorMap tensors = readSafeTensors(writeBytes(bytes));
  EXPECT_EQ(tensors.at("x").values(), TensorData{6});
}

// Read in place, a file's tensors are the same as copied ones, whatever their offsets (a header
// of odd length leaves floats unaligned: those are copied), with int8 weights among them; a
// tensor written to changes neither the file nor its other tensors, and tensors moved out of the
// map outlive it. Where the host's mapped pages are slow to touch, everything is copied, with
// the same results.
TEST_F(SafeTensorsTest, TensorsReadInPlaceAreTheFilesAndWritingThemLeavesTheFileAlone) {
  TensorMap written = {{"a", makeTensor({300, 100}, 1)},
                       {"b", makeTensor({7}, -3)},
                       {"c", makeTensor({64, 64}, 0.5f)}};
  const std::string path = (dir_ / "in_place.safetensors").string();
  writeSafeTensors(path, written);
  const std::string original = readFileBytes(path);
  // An unpadded header of 3 bytes past a multiple of 4: every float unaligned.
  const std::string unalignedJson = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )";
  ASSERT_EQ((8 + unalignedJson.size()) % 4, 3u);
  const std::string unaligned =
      writeBytes(u64(unalignedJson.size()) + unalignedJson + floatBytes({4.5f, -2}));
  // int8 weights with their scales, read as floats.
  const std::string int8Json = R"({"w":{"dtype":"I8","shape":[2,2],"data_offsets":[0,4]},)"
                               R"("w.scale":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                               R"("v":{"dtype":"F32","shape":[3],"data_offsets":[12,24]}})";
  const std::string int8Path = (dir_ / "int8.safetensors").string();
  {
    std::ofstream(int8Path, std::ios::binary) << safetensorsFile(
        int8Json, std::string("\x01\xfe\x03\x00", 4) + floatBytes({0.5f, 2, 7, 8, 9}));
  }
  for (const std::string& file : {path, unaligned, int8Path}) {
    SCOPED_TRACE(file);
    TensorMap copied = readSafeTensors(file);
    TensorMap inPlace = readSafeTensors(file, TensorReading::inPlace);
    ASSERT_EQ(inPlace.size(), copied.size());
    for (const auto& [name, tensor] : copied) {
      EXPECT_EQ(inPlace.at(name).shape(), tensor.shape()) << name;
      EXPECT_EQ(inPlace.at(name).values(), tensor.values()) << name;
    }
  }
  EXPECT_EQ(readSafeTensors(unaligned, TensorReading::inPlace).at("x").values(),
            (TensorData{4.5f, -2}));
  EXPECT_EQ(readSafeTensors(int8Path, TensorReading::inPlace).at("w").values(),
            (TensorData{0.5f, -1, 6, 0}));

  Tensor kept;
  {
    TensorMap inPlace = readSafeTensors(path, TensorReading::inPlace);
    std::fill(inPlace.at("a").values().begin(), inPlace.at("a").values().end(), 42.0f);
    EXPECT_EQ(inPlace.at("b").values(), written.at("b").values());
    EXPECT_EQ(inPlace.at("c").values(), written.at("c").values());
    kept = std::move(inPlace.at("c"));
  }
  EXPECT_EQ(kept.values(), written.at("c").values()) << "outlives the map it was read into";
  EXPECT_EQ(readFileBytes(path), original) << "writes stay in this process";
  EXPECT_EQ(readSafeTensors(path, TensorReading::inPlace).at("a").values(),
            written.at("a").values());
}

// --- Malformed files: the container ------------------------------------------------------------

TEST_F(SafeTensorsTest, MissingFile) {
  std::string p = path("missing.safetensors");
  expectError(p, [&] { readSafeTensors(p); }, {"cannot open file: No such file or directory"});
}

TEST_F(SafeTensorsTest, TooShortForTheHeaderLength) {
  std::string p = writeBytes("abc");
  expectError(p, [&] { readSafeTensors(p); }, {"truncated", "3 bytes"});
}

TEST_F(SafeTensorsTest, HeaderLengthPastTheEndOfTheFile) {
  std::string p = writeBytes(u64(64) + "{}");
  expectError(p, [&] { readSafeTensors(p); },
              {"truncated: header length is 64 but the file has only 2 bytes after it"});
}

TEST_F(SafeTensorsTest, AbsurdHeaderLength) {
  // E.g. an npy or zip file given as weights: the first 8 bytes read as a huge length.
  std::string p = writeBytes(std::string("\x93NUMPY\x01\x00", 8) + " the rest of an npy file");
  expectError(p, [&] { readSafeTensors(p); }, {"header length", "not a safetensors file?"});
}

TEST_F(SafeTensorsTest, HeaderIsNotJson) {
  expectReadError("{\"a\": nope}", "", {"header is not valid JSON", "parse error"});
}

TEST_F(SafeTensorsTest, HeaderIsNotUtf8) {
  expectReadError("{\"a\xff\": {}}", "", {"header is not valid JSON"});
}

TEST_F(SafeTensorsTest, HeaderIsNotAnObject) {
  expectReadError("[1, 2, 3]", "", {"header is not a JSON object: [1,2,3]"});
}

TEST_F(SafeTensorsTest, HeaderNestedTooDeeply) {
  std::string json = R"({"x":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expectReadError(json, "", {"nested too deeply"});
}

TEST_F(SafeTensorsTest, DuplicateTensorName) {
  expectReadError(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  floatBytes({1, 2}), {"tensor 'x' twice"});
}

// A key given twice inside an entry is an error in either order (nlohmann keeps the last, so the
// file once read as F32 one way round and was refused the other).
TEST_F(SafeTensorsTest, DuplicateKeyInAnEntryEitherOrder) {
  expectReadError(R"({"x":{"dtype":"F64","dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                  floatBytes({1}), {"key 'dtype' twice"});
  expectReadError(R"({"x":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})",
                  floatBytes({1}), {"key 'dtype' twice"});
}

// --- Malformed files: the entries --------------------------------------------------------------

TEST_F(SafeTensorsTest, EntryIsNotAnObject) {
  expectReadError(R"({"x": 5})", "", {"tensor 'x': entry is not a JSON object: 5"});
}

TEST_F(SafeTensorsTest, MissingFields) {
  expectReadError(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", floatBytes({1}),
                  {"tensor 'x': missing field 'dtype'"});
  expectReadError(R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", floatBytes({1}),
                  {"tensor 'x': missing field 'shape'"});
  expectReadError(R"({"x":{"dtype":"F32","shape":[1]}})", floatBytes({1}),
                  {"tensor 'x': missing field 'data_offsets'"});
}

TEST_F(SafeTensorsTest, DtypeIsNotAString) {
  expectReadError(R"({"x":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", floatBytes({1}),
                  {"tensor 'x': field 'dtype' is not a string: 32"});
}

TEST_F(SafeTensorsTest, UnsupportedDtype) {
  for (const char* dtype : {"F16", "BF16", "F64", "I64", "U8", "BOOL"}) {
    expectReadError(
        std::string(R"({"x":{"dtype":")") + dtype + R"(","shape":[1],"data_offsets":[0,4]}})",
        floatBytes({1}),
        {std::string("tensor 'x' has dtype ") + dtype + ", expected F32 (or I8 with scales)"});
  }
}

TEST_F(SafeTensorsTest, UnknownDtype) {
  expectReadError(R"({"x":{"dtype":"float32","shape":[1],"data_offsets":[0,4]}})", floatBytes({1}),
                  {"tensor 'x' has unknown dtype \"float32\", expected F32 (or I8 with scales)"});
}

TEST_F(SafeTensorsTest, ShapeIsNotAnArray) {
  expectReadError(R"({"x":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})",
                  floatBytes({1, 2, 3, 4}), {"tensor 'x': field 'shape' is not an array: 4"});
}

TEST_F(SafeTensorsTest, NegativeDimension) {
  expectReadError(R"({"x":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})",
                  floatBytes({1, 2}), {"tensor 'x': shape [2,-1] has a dimension", "-1"});
}

TEST_F(SafeTensorsTest, NonIntegerDimension) {
  expectReadError(R"({"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", floatBytes({1, 2}),
                  {"tensor 'x': shape [2.0] has a dimension"});
  expectReadError(R"({"x":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", floatBytes({1, 2}),
                  {"not a non-negative integer: \"2\""});
  expectReadError(R"({"x":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})",
                  floatBytes({1, 2}), {"not a non-negative integer"});
}

TEST_F(SafeTensorsTest, ShapeWhoseSizeOverflows) {
  expectReadError(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                  "", {"tensor 'x': shape [4294967296, 4294967296] is too large"});
}

TEST_F(SafeTensorsTest, OffsetsAreNotAPair) {
  expectReadError(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", floatBytes({1}),
                  {"tensor 'x': field 'data_offsets' is not a pair of non-negative integers: [0]"});
  expectReadError(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", floatBytes({1}),
                  {"not a pair"});
  expectReadError(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":{"begin":0}}})",
                  floatBytes({1}), {"not a pair"});
}

TEST_F(SafeTensorsTest, NegativeOffset) {
  expectReadError(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", floatBytes({1}),
                  {"tensor 'x': field 'data_offsets' is not a pair of non-negative integers"});
}

TEST_F(SafeTensorsTest, OffsetsEndBeforeTheyBegin) {
  expectReadError(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                  floatBytes({1, 2, 3}), {"tensor 'x': data_offsets [8, 4] end before they begin"});
}

TEST_F(SafeTensorsTest, SizeDoesNotMatchShape) {
  std::string p = writeBytes(
      safetensorsFile(R"({"weight_ih_l0":{"dtype":"F32","shape":[2,4],"data_offsets":[0,12]}})",
                      floatBytes({1, 2, 3})));
  try {
    readSafeTensors(p);
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              p + ": tensor 'weight_ih_l0': data_offsets [0, 12] hold 3 floats but shape [2, 4] "
                  "needs 8");
  }
}

TEST_F(SafeTensorsTest, SizeIsNotAWholeNumberOfFloats) {
  expectReadError(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,7]}})", floatBytes({1, 2}),
                  {"tensor 'x': data_offsets [0, 7] hold 7 bytes", "needs 2 floats (8 bytes)"});
}

TEST_F(SafeTensorsTest, OffsetsPastTheEndOfTheData) {
  // A truncated file: the header is intact but the data stops early.
  expectReadError(
      R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", floatBytes({1, 2}),
      {"tensor 'x': data_offsets [0, 12] go past the end of the data section (8 bytes)"});
  // Offsets so large that begin + size would wrap around.
  expectReadError(R"({"x":{"dtype":"F32","shape":[1],)"
                  R"("data_offsets":[18446744073709551612,18446744073709551616]}})",
                  floatBytes({1}), {"not a pair"});
  expectReadError(R"({"x":{"dtype":"F32","shape":[1],)"
                  R"("data_offsets":[9223372036854775800,9223372036854775804]}})",
                  floatBytes({1}), {"go past the end of the data section"});
}

TEST_F(SafeTensorsTest, OverlappingTensors) {
  expectReadError(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  floatBytes({1, 2, 3}),
                  {"tensors 'a' (data_offsets [0, 8]) and 'b' (data_offsets [4, 12]) overlap"});
  // One tensor inside another, with a third after both: found even though it is not adjacent.
  expectReadError(R"({"big":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                  R"("mid":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                  R"("z":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                  floatBytes({1, 2, 3, 4}), {"'big'", "'mid'", "overlap"});
  expectReadError(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                  floatBytes({1, 2}), {"tensors 'a'", "and 'b'", "overlap"});
}

TEST_F(SafeTensorsTest, EmptyTensorsDoNotOverlap) {
  std::string json = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})";
  TensorMap tensors = readSafeTensors(writeBytes(safetensorsFile(json, floatBytes({1, 2}))));
  EXPECT_EQ(tensors.at("e").shape(), (TensorShape{0, 5}));
  EXPECT_EQ(tensors.at("e").numel(), 0);
}

} // namespace
} // namespace rnnc

namespace rnnc {
namespace {

// int8 weights with their scales (README, "Reduced-precision weights"): read as q * scale, one
// scale per row or one for the tensor; what does not fit is an error naming the tensor.
class QuantizedSafeTensorsTest : public SafeTensorsTest {};

std::string int8Bytes(std::initializer_list<int8_t> values) {
  std::string out;
  for (int8_t v : values)
    out += static_cast<char>(v);
  return out;
}

TEST_F(QuantizedSafeTensorsTest, Int8WeightsAreReadAsQTimesTheirRowsScale) {
  // w: [2, 3] int8 at [0, 6), w.scale [2] at [8, 16), v: [2] int8 at [16, 18), v.scale [1].
  std::string data = int8Bytes({1, -2, 127, -127, 0, 5}) + std::string(2, '\0') +
                     floatBytes({0.5f, 0.25f}) + int8Bytes({3, -4}) + std::string(2, '\0') +
                     floatBytes({2.0f});
  std::string p =
      writeBytes(safetensorsFile(R"({"w":{"dtype":"I8","shape":[2,3],"data_offsets":[0,6]},)"
                                 R"("w.scale":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                                 R"("v":{"dtype":"I8","shape":[2],"data_offsets":[16,18]},)"
                                 R"("v.scale":{"dtype":"F32","shape":[1],"data_offsets":[20,24]}})",
                                 data));
  TensorMap tensors = readSafeTensors(p);
  ASSERT_EQ(tensors.size(), 2u) << "the scales are consumed";
  EXPECT_EQ(tensors.at("w").shape(), (TensorShape{2, 3}));
  EXPECT_EQ(tensors.at("w").values(), (TensorData{0.5f, -1.0f, 63.5f, -31.75f, 0.0f, 1.25f}));
  EXPECT_EQ(tensors.at("v").values(), (TensorData{6.0f, -8.0f}));
}

TEST_F(QuantizedSafeTensorsTest, MissingOrMisshapenScalesAreErrors) {
  expectReadError(R"({"w":{"dtype":"I8","shape":[2,2],"data_offsets":[0,4]}})",
                  int8Bytes({1, 2, 3, 4}), {"tensor 'w'", "is int8 but the file has no 'w.scale'"});
  expectReadError(R"({"w":{"dtype":"I8","shape":[2,2],"data_offsets":[0,4]},)"
                  R"("w.scale":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})",
                  int8Bytes({1, 2, 3, 4}) + floatBytes({1, 1, 1}),
                  {"tensor 'w.scale'", "has shape [3], expected [2] (a scale per row of 'w'"});
  expectReadError(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("w.scale":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  floatBytes({1, 1}), {"tensor 'w.scale'", "scales tensor 'w', which is not int8"});
  expectReadError(R"({"w":{"dtype":"I8","shape":[2,2],"data_offsets":[0,3]}})",
                  int8Bytes({1, 2, 3}),
                  {"tensor 'w'", "hold 3 bytes but int8 shape [2, 2] needs 4"});
}

} // namespace
} // namespace rnnc
