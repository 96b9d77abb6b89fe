// The .npy format (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html):
//
//   "\x93NUMPY" major minor | header length (u16 LE for 1.0, u32 LE for 2.0/3.0) | header | data
//
// The header is a Python dict literal, e.g. `{'descr': '<f4', 'fortran_order': False,
// 'shape': (3, 4), }`, padded with spaces and a final '\n'. We parse it with a small
// recursive-descent parser that accepts exactly the literals NumPy writes (strings, True/False and
// tuples of integers) in any key order, rather than pretending to evaluate Python.
//
// The whole file is read into memory first; every read afterwards is bounds-checked against it,
// so a truncated or corrupt file can only produce a UserError.
#include "runtime/data/Npy.h"

#include "ir/Error.h"
#include "ir/FileIO.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace rnnc {
namespace {

// Data is copied between the file and memory byte for byte, which is only right on a
// little-endian host. Every platform rnnc targets is one.
static_assert(std::endian::native == std::endian::little, "rnnc's npy I/O assumes little-endian");

constexpr std::string_view kNpyMagic = "\x93NUMPY";
// NumPy aligns the start of the data to 64 bytes so that it can be memory-mapped.
constexpr size_t kAlign = 64;

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw UserError(path + ": " + message);
}

// The raw bytes of a vector's elements.
template <typename Values> std::string_view bytesOf(const Values& values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(values[0])};
}

uint32_t readLittleEndian(std::string_view bytes, size_t offset, size_t width) {
  uint32_t value = 0;
  for (size_t i = 0; i < width; ++i)
    value |= uint32_t(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  return value;
}

// Header text for error messages: control and non-ASCII bytes escaped, long headers shortened.
std::string printable(std::string_view text) {
  constexpr size_t kMaxShown = 200;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (text.size() > kMaxShown)
    out += "...";
  return out;
}

struct NpyHeader {
  std::string descr;
  bool fortranOrder = false;
  TensorShape shape;
};

// Parses the dict literal of an npy header. Errors say what was expected and show the header.
class HeaderParser {
public:
  HeaderParser(const std::string& path, std::string_view text) : path_(path), text_(text) {}

  NpyHeader parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortranOrder;
    std::optional<TensorShape> shape;

    expect('{', "'{' at the start of the header");
    while (!consume('}')) {
      std::string key = parseString("a key or '}'");
      expect(':', "':' after key '" + key + "'");
      if (key == "descr" && !descr)
        descr = parseString("a string for 'descr'");
      else if (key == "fortran_order" && !fortranOrder)
        fortranOrder = parseBool();
      else if (key == "shape" && !shape)
        shape = parseShape();
      else if (key == "descr" || key == "fortran_order" || key == "shape")
        error("key '" + key + "' appears twice");
      else
        error("unexpected key '" + key + "' (expected 'descr', 'fortran_order' and 'shape')");
      // Python allows a trailing comma, and NumPy always writes one.
      if (!consume(',')) {
        expect('}', "',' or '}' after the value of '" + key + "'");
        break;
      }
    }
    skipSpace();
    if (pos_ != text_.size())
      error("unexpected text after the closing '}'");

    if (!descr)
      error("no 'descr' key");
    if (!fortranOrder)
      error("no 'fortran_order' key");
    if (!shape)
      error("no 'shape' key");
    return NpyHeader{*descr, *fortranOrder, *shape};
  }

private:
  [[noreturn]] void error(const std::string& message) const {
    // Show the header without NumPy's padding, which is only noise in a message.
    std::string_view shown = text_.substr(0, text_.find_last_not_of(" \n") + 1);
    fail(path_, fmt::format("malformed npy header: {} (at offset {} of \"{}\")", message, pos_,
                            printable(shown)));
  }

  void skipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool consume(char c) {
    skipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c, const std::string& what) {
    if (!consume(c))
      error("expected " + what);
  }

  bool consumeWord(std::string_view word) {
    skipSpace();
    if (text_.substr(pos_, word.size()) != word)
      return false;
    pos_ += word.size();
    return true;
  }

  // A Python string literal in single or double quotes. NumPy's keys and dtype strings never
  // contain quotes or backslashes, so escapes are not supported.
  std::string parseString(const std::string& what) {
    skipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"'))
      error("expected " + what);
    char quote = text_[pos_];
    size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos)
      error("unterminated string");
    std::string value(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return value;
  }

  bool parseBool() {
    if (consumeWord("True"))
      return true;
    if (consumeWord("False"))
      return false;
    error("expected True or False for 'fortran_order'");
  }

  // `()`, `(5,)`, `(3, 4)`; also `(5)`, which NumPy never writes but whose meaning is clear.
  TensorShape parseShape() {
    expect('(', "a tuple for 'shape'");
    TensorShape shape;
    while (!consume(')')) {
      shape.push_back(parseDim());
      if (!consume(',')) {
        expect(')', "',' or ')' in 'shape'");
        break;
      }
    }
    return shape;
  }

  int64_t parseDim() {
    skipSpace();
    if (pos_ < text_.size() && text_[pos_] == '-')
      error("negative dimension in 'shape'");
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9')
      error("expected a dimension in 'shape'");
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      int digit = text_[pos_] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10)
        error("dimension in 'shape' is too large");
      value = value * 10 + digit;
      ++pos_;
    }
    // Python 2 NumPy wrote long integers as `3L`.
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l'))
      ++pos_;
    return value;
  }

  const std::string& path_;
  std::string_view text_;
  size_t pos_ = 0;
};

// Splits the file into its parsed header and the bytes after it.
struct ParsedNpy {
  NpyHeader header;
  std::string_view data;
};

ParsedNpy parseNpy(const std::string& path, std::string_view bytes) {
  if (bytes.substr(0, kNpyMagic.size()) != kNpyMagic)
    fail(path, "not an npy file: it does not start with the magic string \"\\x93NUMPY\"");
  if (bytes.size() < kNpyMagic.size() + 2)
    fail(path, fmt::format("truncated: the file has only {} bytes", bytes.size()));

  int major = static_cast<unsigned char>(bytes[6]);
  int minor = static_cast<unsigned char>(bytes[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail(path, fmt::format("unsupported npy format version {}.{} (rnnc reads 1.0, 2.0 and 3.0)",
                           major, minor));

  // Version 1.0 has a 2-byte header length; 2.0 and 3.0 (UTF-8 header) have 4 bytes.
  size_t lengthWidth = major == 1 ? 2 : 4;
  size_t headerStart = kNpyMagic.size() + 2 + lengthWidth;
  if (bytes.size() < headerStart)
    fail(path, fmt::format("truncated: the file has only {} bytes", bytes.size()));
  size_t headerLength = readLittleEndian(bytes, 8, lengthWidth);
  if (headerLength > bytes.size() - headerStart)
    fail(path, fmt::format("truncated: the header is {} bytes long but the file has only {} after "
                           "the header length",
                           headerLength, bytes.size() - headerStart));

  NpyHeader header = HeaderParser(path, bytes.substr(headerStart, headerLength)).parse();
  return ParsedNpy{std::move(header), bytes.substr(headerStart + headerLength)};
}

std::string dtypeName(std::string_view descr) {
  std::string_view code = descr.size() == 3 ? descr.substr(1) : descr;
  if (code == "f2")
    return "float16";
  if (code == "f4")
    return "float32";
  if (code == "f8")
    return "float64";
  if (code == "i1" || code == "i2" || code == "i4" || code == "i8")
    return fmt::format("int{}", (code[1] - '0') * 8);
  if (code == "u1" || code == "u2" || code == "u4" || code == "u8")
    return fmt::format("uint{}", (code[1] - '0') * 8);
  if (code == "b1")
    return "bool";
  return "";
}

// Checks the header against the element type the caller wants and returns the data bytes,
// exactly numel * itemSize of them.
std::string_view checkedData(const std::string& path, const ParsedNpy& npy,
                             std::string_view wantDescr, size_t itemSize, const char* conversion) {
  const NpyHeader& header = npy.header;
  if (header.descr != wantDescr) {
    if (header.descr.size() == 3 && header.descr[0] == '>' &&
        header.descr.substr(1) == wantDescr.substr(1))
      fail(path, fmt::format("dtype '{}' is big-endian; rnnc reads only little-endian '{}'",
                             printable(header.descr), wantDescr));
    std::string name = dtypeName(header.descr);
    fail(path, fmt::format("dtype is '{}'{}, expected '{}' ({}); convert with {}",
                           printable(header.descr), name.empty() ? "" : " (" + name + ")",
                           wantDescr, dtypeName(wantDescr), conversion));
  }
  if (header.fortranOrder)
    fail(path, "array is in Fortran order; rnnc reads only C order (save np.ascontiguousarray(x))");

  // numel * itemSize, refusing shapes whose size does not even fit in 64 bits.
  int64_t maxBytes = std::numeric_limits<int64_t>::max();
  int64_t numel = 1;
  for (int64_t d : header.shape) {
    if (d != 0 && numel > maxBytes / static_cast<int64_t>(itemSize) / d)
      fail(path, "shape " + shapeToString(header.shape) + " is too large");
    numel *= d;
  }
  size_t wantBytes = static_cast<size_t>(numel) * itemSize;
  if (npy.data.size() < wantBytes)
    fail(path, fmt::format("truncated: header says shape {} ({} bytes of data) but the file has {}",
                           shapeToString(header.shape), wantBytes, npy.data.size()));
  if (npy.data.size() > wantBytes)
    fail(path, fmt::format("header says shape {} ({} bytes of data) but the file has {}: {} "
                           "unexpected bytes at the end",
                           shapeToString(header.shape), wantBytes, npy.data.size(),
                           npy.data.size() - wantBytes));
  return npy.data;
}

template <typename T> std::vector<T> copyValues(std::string_view data) {
  std::vector<T> values(data.size() / sizeof(T));
  // memcpy with a null (empty vector) destination is UB even for zero bytes.
  if (!data.empty())
    std::memcpy(values.data(), data.data(), data.size());
  return values;
}

std::string shapeTuple(const TensorShape& shape) {
  if (shape.size() == 1)
    return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

// The magic string, version, header length and header, laid out the way np.save does it.
std::string npyPreamble(std::string_view descr, const TensorShape& shape) {
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr,
                                 shapeTuple(shape));
  // Version 1.0 unless the header does not fit a 16-bit length (only for absurd ranks).
  bool v1 = dict.size() + kAlign < 0xffff;
  size_t prefixSize = kNpyMagic.size() + 2 + (v1 ? 2 : 4);
  // Spaces, then '\n', so that the data starts at a multiple of kAlign.
  size_t unpadded = prefixSize + dict.size() + 1;
  size_t headerLength = dict.size() + 1 + (kAlign - unpadded % kAlign) % kAlign;

  std::string out(kNpyMagic);
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  for (size_t i = 0; i < (v1 ? 2u : 4u); ++i)
    out += static_cast<char>((headerLength >> (8 * i)) & 0xff);
  out += dict;
  out.append(headerLength - dict.size() - 1, ' ');
  out += '\n';
  return out;
}

void checkShape(const TensorShape& shape, size_t valueCount) {
  for (int64_t d : shape)
    RNNC_INTERNAL_CHECK(d >= 0, "negative dimension in shape " + shapeToString(shape));
  RNNC_INTERNAL_CHECK(
      static_cast<size_t>(numElements(shape)) == valueCount,
      fmt::format("shape {} does not match {} values", shapeToString(shape), valueCount));
}

} // namespace

Tensor readNpyFloat32(const std::string& path) {
  FileBytes file = mapFileBytes(path);
  return parseNpyFloat32(file.view(), path);
}

Int64Array readNpyInt64(const std::string& path) {
  return parseNpyInt64(readFileBytes(path), path);
}

NpyFloat32View viewNpyFloat32(std::string_view bytes, const std::string& path) {
  ParsedNpy npy = parseNpy(path, bytes);
  std::string_view data = checkedData(path, npy, "<f4", sizeof(float), "x.astype(np.float32)");
  return {std::move(npy.header.shape), data};
}

Tensor parseNpyFloat32(std::string_view bytes, const std::string& path) {
  NpyFloat32View npy = viewNpyFloat32(bytes, path);
  Tensor tensor = Tensor::ofBytes(std::move(npy.shape), npy.data);
  tensor.setSource(path);
  return tensor;
}

Int64Array parseNpyInt64(std::string_view bytes, const std::string& path) {
  ParsedNpy npy = parseNpy(path, bytes);
  std::string_view data = checkedData(path, npy, "<i8", sizeof(int64_t), "x.astype(np.int64)");
  return Int64Array{npy.header.shape, copyValues<int64_t>(data), path};
}

void writeNpy(const std::string& path, const Tensor& tensor) {
  // A default-constructed Tensor has shape [] but no value; it must not reach a file.
  checkShape(tensor.shape(), tensor.values().size());
  writeFileBytes(path, {npyPreamble("<f4", tensor.shape()), bytesOf(tensor.values())});
}

void writeNpy(const std::string& path, const Int64Array& array) {
  checkShape(array.shape, array.values.size());
  writeFileBytes(path, {npyPreamble("<i8", array.shape), bytesOf(array.values)});
}

} // namespace rnnc
