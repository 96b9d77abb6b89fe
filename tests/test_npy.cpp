// Tests for runtime/data/Npy: round trips, files laid out byte for byte as NumPy writes them, and
// one test per kind of malformed file, each checking that the UserError names the file and the
// problem.
#include "runtime/data/Npy.h"

#include "ir/Error.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/TestSupport.h"
#include <unistd.h>

namespace rnnc {
namespace {

namespace fs = std::filesystem;
using testing::HasSubstr;
using testing::StartsWith;

class NpyTest : public test::ScratchDirTest {
protected:
  void expectFloatError(const std::string& p, std::initializer_list<std::string> fragments) {
    expectError(p, [&] { readNpyFloat32(p); }, fragments);
  }
};

// Little-endian bytes of a value, as they appear in a file.
template <typename T> std::string bytesOf(std::initializer_list<T> values) {
  std::string out;
  for (T v : values)
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  return out;
}

// An npy file with the given header dict, padded the way NumPy pads it, followed by `data`.
std::string npyFile(const std::string& dict, const std::string& data, int major = 1) {
  size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i)
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string floatDict(const std::string& shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
}

std::vector<float> iotaFloats(size_t n) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i)
    values[i] = 0.5f * static_cast<float>(i) - 3.25f;
  return values;
}

// --- Round trips -------------------------------------------------------------------------------

TEST_F(NpyTest, Float32RoundTripsForEveryRank) {
  const std::vector<TensorShape> shapes = {{},  {5},       {3, 4},      {2, 3, 4},
                                           {0}, {3, 0, 2}, {1, 1, 1, 7}};
  for (const TensorShape& shape : shapes) {
    SCOPED_TRACE(shapeToString(shape));
    Tensor tensor(shape, iotaFloats(static_cast<size_t>(numElements(shape))));
    std::string p = path("t.npy");
    writeNpy(p, tensor);
    Tensor back = readNpyFloat32(p);
    EXPECT_EQ(back.shape(), shape);
    EXPECT_EQ(back.values(), tensor.values());
  }
}

TEST_F(NpyTest, Int64RoundTripsForEveryRank) {
  const std::vector<Int64Array> arrays = {
      {{}, {42}},
      {{4}, {7, -1, INT64_MAX, INT64_MIN}},
      {{2, 3}, {1, 2, 3, 4, 5, 6}},
      {{0}, {}},
      {{2, 0, 3}, {}},
  };
  for (const Int64Array& array : arrays) {
    SCOPED_TRACE(shapeToString(array.shape));
    std::string p = path("a.npy");
    writeNpy(p, array);
    Int64Array back = readNpyInt64(p);
    EXPECT_EQ(back.shape, array.shape);
    EXPECT_EQ(back.values, array.values);
  }
}

TEST_F(NpyTest, SpecialFloatValuesSurviveBitForBit) {
  Tensor tensor({4}, std::vector<float>{-0.0f, 1e-45f, std::numeric_limits<float>::infinity(),
                                        std::numeric_limits<float>::max()});
  std::string p = path("t.npy");
  writeNpy(p, tensor);
  // Compare bytes, not floats: -0.0f == 0.0f would hide a lost sign.
  std::string bytes = readBytes(p);
  ASSERT_GE(bytes.size(), 16u);
  EXPECT_EQ(bytes.substr(bytes.size() - 16),
            bytesOf<float>({-0.0f, 1e-45f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::max()}));
  EXPECT_EQ(bytesOf<float>({readNpyFloat32(p).values()[0]}), bytesOf<float>({-0.0f}));
}

// --- The writer's layout -----------------------------------------------------------------------

TEST_F(NpyTest, WriterLaysOutTheHeaderLikeNumPy) {
  std::string p = path("t.npy");
  writeNpy(p, Tensor({3, 4}, iotaFloats(12)));
  std::string bytes = readBytes(p);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  size_t headerLength =
      static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + headerLength) % 64, 0u);
  ASSERT_EQ(bytes.size(), 10 + headerLength + 12 * sizeof(float));
  std::string header = bytes.substr(10, headerLength);
  EXPECT_THAT(header, StartsWith("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"));
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(header.find_first_not_of(' ', 60), header.size() - 1) << "pad with spaces only";
}

TEST_F(NpyTest, WriterSpellsScalarAndOneDimensionalShapesAsPythonTuples) {
  writeNpy(path("scalar.npy"), Tensor({}, 1.0f));
  writeNpy(path("vector.npy"), Int64Array{{5}, {1, 2, 3, 4, 5}});
  EXPECT_THAT(readBytes(path("scalar.npy")), HasSubstr("'shape': (), }"));
  EXPECT_THAT(readBytes(path("vector.npy")),
              HasSubstr("{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }"));
}

TEST_F(NpyTest, WriterReportsAnUnwritablePath) {
  std::string p = path("no_such_dir/t.npy");
  expectError(p, [&] { writeNpy(p, Tensor({2}, 1.0f)); },
              {"cannot open file for writing", "No such file or directory"});
}

// --- Files as NumPy writes them ----------------------------------------------------------------

// np.save("x.npy", np.arange(6, dtype=np.float32).reshape(2, 3)) with NumPy >= 1.24, which adds
// 21 - len("2") spaces of room to grow the first axis before padding to 64 bytes.
TEST_F(NpyTest, ReadsAFileWrittenByNumPy) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') + "\n";
  ASSERT_EQ(header.size(), 118u);
  std::string bytes =
      std::string("\x93NUMPY\x01\x00\x76\x00", 10) + header + bytesOf<float>({0, 1, 2, 3, 4, 5});
  Tensor t = readNpyFloat32(writeBytes("x.npy", bytes));
  EXPECT_EQ(t.shape(), (TensorShape{2, 3}));
  EXPECT_EQ(t.values(), (TensorData{0, 1, 2, 3, 4, 5}));
}

// np.save("lens.npy", np.array([3, 1, 4, 1], dtype=np.int64)) with an older NumPy (no growth room).
TEST_F(NpyTest, ReadsAnInt64FileWrittenByOlderNumPy) {
  std::string header =
      "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }" + std::string(60, ' ') + "\n";
  ASSERT_EQ(header.size(), 118u);
  std::string bytes =
      std::string("\x93NUMPY\x01\x00\x76\x00", 10) + header + bytesOf<int64_t>({3, 1, 4, 1});
  Int64Array a = readNpyInt64(writeBytes("lens.npy", bytes));
  EXPECT_EQ(a.shape, (TensorShape{4}));
  EXPECT_EQ(a.values, (std::vector<int64_t>{3, 1, 4, 1}));
}

// np.save of a 0-d array: shape `()`, one value.
TEST_F(NpyTest, ReadsAScalarFile) {
  Tensor t = readNpyFloat32(writeBytes("s.npy", npyFile(floatDict("()"), bytesOf<float>({2.5f}))));
  EXPECT_EQ(t.shape(), TensorShape{});
  EXPECT_EQ(t.values(), TensorData{2.5f});
}

TEST_F(NpyTest, ReadsFormatVersions2And3) {
  for (int major : {2, 3}) {
    SCOPED_TRACE(major);
    std::string p = writeBytes("v.npy", npyFile(floatDict("(2,)"), bytesOf<float>({1, 2}), major));
    Tensor t = readNpyFloat32(p);
    EXPECT_EQ(t.shape(), TensorShape{2});
    EXPECT_EQ(t.values(), (TensorData{1, 2}));
  }
}

TEST_F(NpyTest, ParsesHeadersInAnyKeyOrderAndSpacing) {
  const std::vector<std::string> dicts = {
      "{'shape': (2, 1), 'fortran_order': False, 'descr': '<f4'}",
      "{ \"descr\" : \"<f4\" , \"shape\" : ( 2 , 1 , ) , \"fortran_order\" : False , }",
      "{'fortran_order':False,'descr':'<f4','shape':(2L,1L)}",
      "\t{'descr': '<f4',\n 'fortran_order': False, 'shape': (2, 1)}",
  };
  for (const std::string& dict : dicts) {
    SCOPED_TRACE(dict);
    Tensor t = readNpyFloat32(writeBytes("h.npy", npyFile(dict, bytesOf<float>({1, 2}))));
    EXPECT_EQ(t.shape(), (TensorShape{2, 1}));
  }
}

// --- Malformed files ---------------------------------------------------------------------------

TEST_F(NpyTest, MissingFile) {
  expectFloatError(path("x.npy"), {"cannot open file: No such file or directory"});
}

TEST_F(NpyTest, DirectoryInsteadOfFile) {
  std::string p = path("dir.npy");
  fs::create_directory(p);
  expectFloatError(p, {"cannot read file", "Is a directory"});
}

TEST_F(NpyTest, EmptyFile) {
  expectFloatError(writeBytes("x.npy", ""), {"not an npy file"});
}

TEST_F(NpyTest, BadMagic) {
  expectFloatError(writeBytes("x.npy", "PK\x03\x04 this is a zip file"), {"not an npy file"});
}

TEST_F(NpyTest, UnsupportedVersion) {
  std::string bytes = npyFile(floatDict("(1,)"), bytesOf<float>({1}));
  bytes[6] = 4;
  expectFloatError(writeBytes("x.npy", bytes), {"unsupported npy format version 4.0"});
  bytes[6] = 1;
  bytes[7] = 1;
  expectFloatError(writeBytes("x.npy", bytes), {"unsupported npy format version 1.1"});
}

TEST_F(NpyTest, TruncatedBeforeTheHeaderLength) {
  expectFloatError(writeBytes("x.npy", std::string("\x93NUMPY\x01\x00\x76", 9)), {"truncated"});
  expectFloatError(writeBytes("x.npy", std::string("\x93NUMPY\x02\x00\x76\x00\x00", 11)),
                   {"truncated"});
}

TEST_F(NpyTest, TruncatedHeader) {
  std::string bytes = npyFile(floatDict("(3, 4)"), "");
  expectFloatError(writeBytes("x.npy", bytes.substr(0, 50)),
                   {"truncated", "header is 118 bytes long", "only 40"});
}

TEST_F(NpyTest, TruncatedData) {
  std::string bytes = npyFile(floatDict("(3, 4)"), bytesOf<float>({1, 2, 3, 4, 5}));
  expectFloatError(writeBytes("x.npy", bytes),
                   {"truncated: header says shape [3, 4] (48 bytes of data) but the file has 20"});
}

TEST_F(NpyTest, ExtraBytesAfterTheData) {
  std::string bytes = npyFile(floatDict("(2,)"), bytesOf<float>({1, 2, 3}));
  expectFloatError(writeBytes("x.npy", bytes), {"shape [2]", "4 unexpected bytes"});
}

TEST_F(NpyTest, BigEndianFloat) {
  std::string dict = "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }";
  expectFloatError(writeBytes("x.npy", npyFile(dict, bytesOf<float>({1}))),
                   {"'>f4' is big-endian", "little-endian '<f4'"});
}

TEST_F(NpyTest, WrongFloatDtype) {
  std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }";
  expectFloatError(writeBytes("x.npy", npyFile(dict, bytesOf<double>({1}))),
                   {"dtype is '<f8' (float64), expected '<f4' (float32)", "astype(np.float32)"});
}

TEST_F(NpyTest, WrongIntDtype) {
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }";
  std::string p = writeBytes("x.npy", npyFile(dict, bytesOf<int32_t>({1, 2})));
  expectError(p, [&] { readNpyInt64(p); },
              {"dtype is '<i4' (int32), expected '<i8' (int64)", "astype(np.int64)"});
  // And a float file given to the int64 reader.
  std::string q = writeBytes("y.npy", npyFile(floatDict("(2,)"), bytesOf<float>({1, 2})));
  expectError(q, [&] { readNpyInt64(q); }, {"dtype is '<f4' (float32), expected '<i8'"});
}

TEST_F(NpyTest, StructuredDtype) {
  std::string dict = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }";
  expectFloatError(writeBytes("x.npy", npyFile(dict, bytesOf<float>({1}))),
                   {"malformed npy header", "expected a string for 'descr'"});
}

TEST_F(NpyTest, FortranOrder) {
  std::string dict = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }";
  expectFloatError(writeBytes("x.npy", npyFile(dict, bytesOf<float>({1, 2, 3, 4}))),
                   {"Fortran order"});
}

TEST_F(NpyTest, HeaderMissingKey) {
  std::string dict = "{'descr': '<f4', 'shape': (2,), }";
  expectFloatError(writeBytes("x.npy", npyFile(dict, bytesOf<float>({1, 2}))),
                   {"malformed npy header", "no 'fortran_order' key"});
}

TEST_F(NpyTest, HeaderUnexpectedKey) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}";
  expectFloatError(writeBytes("x.npy", npyFile(dict, bytesOf<float>({1, 2}))),
                   {"malformed npy header", "unexpected key 'extra'"});
}

TEST_F(NpyTest, HeaderDuplicateKey) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (1,)}";
  expectFloatError(writeBytes("x.npy", npyFile(dict, bytesOf<float>({1, 2}))),
                   {"key 'shape' appears twice"});
}

TEST_F(NpyTest, HeaderNotADict) {
  expectFloatError(writeBytes("x.npy", npyFile("[1, 2]", "")),
                   {"malformed npy header", "expected '{'", "[1, 2]"});
}

TEST_F(NpyTest, HeaderBadBool) {
  std::string dict = "{'descr': '<f4', 'fortran_order': false, 'shape': (2,), }";
  expectFloatError(writeBytes("x.npy", npyFile(dict, "")), {"expected True or False"});
}

TEST_F(NpyTest, HeaderMissingColon) {
  std::string dict = "{'descr' '<f4', 'fortran_order': False, 'shape': (2,), }";
  expectFloatError(writeBytes("x.npy", npyFile(dict, "")), {"expected ':' after key 'descr'"});
}

TEST_F(NpyTest, HeaderUnterminatedString) {
  expectFloatError(writeBytes("x.npy", npyFile("{'descr: '<f4", "")), {"malformed npy header"});
  expectFloatError(writeBytes("x.npy", npyFile("{'descr", "")), {"unterminated string"});
}

TEST_F(NpyTest, HeaderUnclosedDict) {
  expectFloatError(writeBytes("x.npy", npyFile("{'descr': '<f4', ", "")),
                   {"malformed npy header", "expected a key or '}'"});
  expectFloatError(writeBytes("x.npy", npyFile("{'shape': (2, 3", "")),
                   {"expected ',' or ')' in 'shape'"});
}

TEST_F(NpyTest, HeaderTextAfterTheDict) {
  std::string dict = floatDict("(2,)") + " junk";
  expectFloatError(writeBytes("x.npy", npyFile(dict, bytesOf<float>({1, 2}))),
                   {"unexpected text after the closing '}'"});
}

TEST_F(NpyTest, HeaderNegativeDimension) {
  expectFloatError(writeBytes("x.npy", npyFile(floatDict("(-2, 3)"), "")), {"negative dimension"});
}

TEST_F(NpyTest, HeaderNonIntegerDimension) {
  expectFloatError(writeBytes("x.npy", npyFile(floatDict("(2.5,)"), "")),
                   {"expected ',' or ')' in 'shape'"});
  expectFloatError(writeBytes("x.npy", npyFile(floatDict("(None,)"), "")),
                   {"expected a dimension in 'shape'"});
}

TEST_F(NpyTest, HeaderDimensionOverflowsInt64) {
  expectFloatError(writeBytes("x.npy", npyFile(floatDict("(99999999999999999999,)"), "")),
                   {"dimension in 'shape' is too large"});
}

TEST_F(NpyTest, ShapeWhoseSizeOverflows) {
  // Each dimension fits in int64 but the byte count does not; it must not wrap to a small size.
  expectFloatError(writeBytes("x.npy", npyFile(floatDict("(4294967296, 4294967296)"), "")),
                   {"shape [4294967296, 4294967296] is too large"});
  expectFloatError(writeBytes("x.npy", npyFile(floatDict("(4611686018427387904,)"), "")),
                   {"is too large"});
}

TEST_F(NpyTest, HeaderWithControlBytesIsPrintedEscaped) {
  expectFloatError(writeBytes("x.npy", npyFile(std::string("\x01\xff", 2), "")), {"\\x01\\xff"});
}

} // namespace
} // namespace rnnc
