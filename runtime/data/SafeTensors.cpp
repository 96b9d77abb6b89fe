// The safetensors format (https://huggingface.co/docs/safetensors):
//
//   header length N (u64 LE) | N bytes of JSON | data section
//
// The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, with offsets
// relative to the start of the data section; the optional "__metadata__" entry holds free-form
// strings. The file comes from outside, so everything in the header is validated before any data
// is touched: a bad file can only produce a UserError that names the file and the tensor.
#include "runtime/data/SafeTensors.h"

#include "ir/Error.h"
#include "ir/FileIO.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace rnnc {
namespace {

using nlohmann::json;

// Data is copied between the file and memory byte for byte, which is only right on a
// little-endian host. Every platform rnnc targets is one.
static_assert(std::endian::native == std::endian::little,
              "rnnc's safetensors I/O assumes little-endian");

constexpr const char* kMetadataKey = "__metadata__";
// The limit the reference implementation uses; a larger length means a corrupt or foreign file,
// and refusing it keeps us from parsing megabytes of garbage as JSON.
constexpr uint64_t kMaxHeaderLength = 100'000'000;
// A valid header nests three deep (object, entry, shape); the limit stops pathological nesting
// before it costs much stack.
constexpr int kMaxJsonDepth = 16;

[[noreturn]] void failIn(const std::string& path, const std::string& message) {
  throw UserError(path + ": " + message);
}

[[noreturn]] void failTensor(const std::string& path, const std::string& name,
                             const std::string& message) {
  failIn(path, "tensor '" + name + "': " + message);
}

// A JSON value for an error message, shortened so a huge value cannot flood the terminal.
std::string shortDump(const json& value) {
  constexpr size_t kMaxShown = 80;
  std::string text = value.dump();
  if (text.size() > kMaxShown)
    text = text.substr(0, kMaxShown) + "...";
  return text;
}

// Parses the header, rejecting duplicate keys in any object (nlohmann would silently keep the
// last: a tensor lost, or of two `dtype`s the second, so that the file meant one thing or another
// by the order of its keys) and absurd nesting.
json parseHeader(const std::string& path, std::string_view text) {
  std::vector<std::set<std::string>> objects; // the keys of each object being read
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth)
      failIn(path, "header is not a valid safetensors header: JSON nested too deeply");
    if (event == json::parse_event_t::object_start)
      objects.emplace_back();
    else if (event == json::parse_event_t::object_end && !objects.empty())
      objects.pop_back();
    else if (event == json::parse_event_t::key && !objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!objects.back().insert(key).second)
        failIn(path, depth == 1 ? "header lists tensor '" + key + "' twice"
                                : "header gives key '" + key + "' twice in one entry");
    }
    return true;
  };
  try {
    json header = json::parse(text.begin(), text.end(), callback);
    if (!header.is_object())
      failIn(path, "header is not a JSON object: " + shortDump(header));
    return header;
  } catch (const json::exception& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix; the rest is the useful part.
    std::string_view what = e.what();
    if (auto bracket = what.find("] "); bracket != std::string_view::npos)
      what.remove_prefix(bracket + 2);
    failIn(path, fmt::format("header is not valid JSON: {}", what));
  }
}

bool isKnownDtype(std::string_view dtype) {
  static constexpr std::string_view kKnown[] = {
      "BOOL", "U8",  "I8",  "U16", "I16",     "U32",     "I32",     "U64",     "I64",     "F16",
      "BF16", "F32", "F64", "F4",  "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0", "E8M0"};
  return std::find(std::begin(kKnown), std::end(kKnown), dtype) != std::end(kKnown);
}

// A header entry, validated against the data section but not yet read.
struct Entry {
  std::string name;
  TensorShape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  bool int8 = false; // I8 (a quantized weight with its scales beside it), else F32
};

const json& field(const std::string& path, const std::string& name, const json& entry,
                  const char* key) {
  auto it = entry.find(key);
  if (it == entry.end())
    failTensor(path, name, fmt::format("missing field '{}'", key));
  return *it;
}

// A non-negative integer that fits in int64_t (nlohmann stores non-negative numbers as unsigned).
bool isDimension(const json& value) {
  return value.is_number_unsigned() &&
         value.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max());
}

TensorShape parseShape(const std::string& path, const std::string& name, const json& value) {
  if (!value.is_array())
    failTensor(path, name, "field 'shape' is not an array: " + shortDump(value));
  TensorShape shape;
  for (const json& dim : value) {
    if (!isDimension(dim))
      failTensor(path, name,
                 fmt::format("shape {} has a dimension that is not a non-negative integer: {}",
                             shortDump(value), shortDump(dim)));
    shape.push_back(dim.get<int64_t>());
  }
  return shape;
}

void parseOffsets(const std::string& path, const std::string& name, const json& value,
                  Entry& entry) {
  if (!value.is_array() || value.size() != 2 || !isDimension(value[0]) || !isDimension(value[1]))
    failTensor(path, name,
               "field 'data_offsets' is not a pair of non-negative integers: " + shortDump(value));
  entry.begin = value[0].get<uint64_t>();
  entry.end = value[1].get<uint64_t>();
}

// Number of bytes of data the shape needs, or nothing when that overflows 64 bits.
std::optional<uint64_t> dataBytes(const TensorShape& shape, uint64_t elementBytes) {
  uint64_t bytes = elementBytes;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
      return std::nullopt;
  return bytes;
}

Entry parseEntry(const std::string& path, const std::string& name, const json& value,
                 uint64_t dataSize) {
  if (!value.is_object())
    failTensor(path, name, "entry is not a JSON object: " + shortDump(value));

  const json& dtype = field(path, name, value, "dtype");
  if (!dtype.is_string())
    failTensor(path, name, "field 'dtype' is not a string: " + shortDump(dtype));
  const auto& dtypeName = dtype.get_ref<const std::string&>();
  if (dtypeName != "F32" && dtypeName != "I8") {
    std::string what =
        isKnownDtype(dtypeName) ? "dtype " + dtypeName : "unknown dtype " + shortDump(dtype);
    failIn(path, fmt::format("tensor '{}' has {}, expected F32 (or I8 with scales)", name, what));
  }

  Entry entry{name, parseShape(path, name, field(path, name, value, "shape")), 0, 0,
              dtypeName == "I8"};
  parseOffsets(path, name, field(path, name, value, "data_offsets"), entry);

  std::string offsets = fmt::format("data_offsets [{}, {}]", entry.begin, entry.end);
  std::string shape = shapeToString(entry.shape);
  if (entry.end < entry.begin)
    failTensor(path, name, offsets + " end before they begin");
  std::optional<uint64_t> want = dataBytes(entry.shape, entry.int8 ? 1 : sizeof(float));
  if (!want)
    failTensor(path, name, "shape " + shape + " is too large");
  uint64_t have = entry.end - entry.begin;
  if (entry.int8 && have != *want)
    failTensor(
        path, name,
        fmt::format("{} hold {} bytes but int8 shape {} needs {}", offsets, have, shape, *want));
  if (have != *want) {
    if (have % sizeof(float) == 0)
      failTensor(path, name,
                 fmt::format("{} hold {} floats but shape {} needs {}", offsets,
                             have / sizeof(float), shape, *want / sizeof(float)));
    failTensor(path, name,
               fmt::format("{} hold {} bytes, not a whole number of floats; shape {} needs {} "
                           "floats ({} bytes)",
                           offsets, have, shape, *want / sizeof(float), *want));
  }
  if (entry.end > dataSize)
    failTensor(path, name,
               fmt::format("{} go past the end of the data section ({} bytes); is the file "
                           "truncated?",
                           offsets, dataSize));
  return entry;
}

// Two tensors sharing bytes would alias each other's weights: always a corrupt file.
void checkNoOverlap(const std::string& path, std::vector<const Entry*> entries) {
  // Empty tensors hold no bytes, so they cannot overlap anything.
  std::erase_if(entries, [](const Entry* e) { return e->begin == e->end; });
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  const Entry* furthest = nullptr; // the entry seen so far that ends last
  for (const Entry* e : entries) {
    if (furthest && e->begin < furthest->end)
      failIn(path, fmt::format("tensors '{}' (data_offsets [{}, {}]) and '{}' (data_offsets [{}, "
                               "{}]) overlap",
                               furthest->name, furthest->begin, furthest->end, e->name, e->begin,
                               e->end));
    if (!furthest || e->end > furthest->end)
      furthest = e;
  }
}

// A quantized weight (README, "Reduced-precision weights"): NAME of dtype I8, [rows, ...], and
// NAME.scale of F32, [rows] (a scale per output channel) or [1] (one for the tensor): the weight
// is q * scale, an fp32 tensor from here on (--weights-dtype int8 quantizes it again, to the same
// integers when the scales are max|w| / 127 per row).
void dequantize(const std::string& path, const TensorMap& quantized, TensorMap& tensors) {
  for (const auto& [name, q] : quantized) {
    auto found = tensors.find(name + ".scale");
    if (found == tensors.end())
      failTensor(path, name,
                 "is int8 but the file has no '" + name + ".scale' (F32, one scale per row)");
    const Tensor& scale = found->second;
    const int64_t rows = q.rank() > 0 ? q.dim(0) : 1;
    if (scale.numel() != rows && scale.numel() != 1)
      failTensor(path, name + ".scale",
                 fmt::format("has shape {}, expected [{}] (a scale per row of '{}', shape {}) or "
                             "[1]",
                             scale.shapeString(), rows, name, q.shapeString()));
    Tensor weight = q;
    const int64_t perRow = rows > 0 ? weight.numel() / rows : 0;
    for (int64_t i = 0; i < weight.numel(); ++i)
      weight.data()[i] *= scale.data()[scale.numel() == 1 ? 0 : i / perRow];
    tensors.erase(found);
    tensors.emplace(name, std::move(weight));
  }
  for (const auto& [name, tensor] : tensors)
    if (name.size() > 6 && name.ends_with(".scale") &&
        !quantized.count(name.substr(0, name.size() - 6)) &&
        tensors.count(name.substr(0, name.size() - 6)))
      failTensor(path, name,
                 "scales tensor '" + name.substr(0, name.size() - 6) + "', which is not int8");
}

uint64_t readU64(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i)
    value |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return value;
}

std::string u64Bytes(uint64_t value) {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i)
    out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

} // namespace

namespace {

// The header length from the file's first 8 bytes, checked against the file's size.
uint64_t checkedHeaderLength(const std::string& path, std::string_view first8, uint64_t fileBytes) {
  if (fileBytes < 8)
    failIn(path,
           fmt::format("truncated: the file has {} bytes, too few for the 8-byte header length "
                       "of a safetensors file",
                       fileBytes));
  uint64_t headerLength = readU64(first8);
  if (headerLength > kMaxHeaderLength)
    failIn(path, fmt::format("header length {} is over the {} byte limit; not a safetensors file?",
                             headerLength, kMaxHeaderLength));
  if (headerLength > fileBytes - 8)
    failIn(path,
           fmt::format("truncated: header length is {} but the file has only {} bytes after it",
                       headerLength, fileBytes - 8));
  return headerLength;
}

// The header's entries, each checked against a data section of `dataSize` bytes.
std::vector<Entry> parseEntries(const std::string& path, std::string_view headerText,
                                uint64_t dataSize) {
  json header = parseHeader(path, headerText);
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name != kMetadataKey)
      entries.push_back(parseEntry(path, name, value, dataSize));
  }
  std::vector<const Entry*> pointers;
  for (const Entry& e : entries)
    pointers.push_back(&e);
  checkNoOverlap(path, std::move(pointers));
  return entries;
}

// The tensors of checked entries; readData(begin, bytes, into) copies `bytes` bytes from offset
// `begin` of the data section, and borrow(begin, count) gives the float32 tensor's `count`
// floats where they lie, or nothing to have them copied.
template <class ReadData, class Borrow>
TensorMap readEntries(const std::string& path, std::vector<Entry>& entries, ReadData readData,
                      Borrow borrow) {
  TensorMap tensors;
  std::map<std::string, Tensor> quantized; // I8 tensors, as their integer values
  for (Entry& e : entries) {
    const size_t bytes = e.end - e.begin;
    if (e.int8) {
      std::string raw(bytes, '\0');
      readData(e.begin, bytes, raw.data());
      std::vector<float> values;
      values.reserve(bytes);
      for (char byte : raw)
        values.push_back(static_cast<float>(static_cast<int8_t>(byte)));
      quantized.emplace(e.name, Tensor(std::move(e.shape), std::move(values)));
    } else if (std::optional<BorrowedFloats> floats = borrow(e.begin, bytes / sizeof(float))) {
      tensors.emplace(e.name, Tensor::borrowing(std::move(e.shape), std::move(*floats)));
    } else {
      Tensor tensor = Tensor::uninitialized(std::move(e.shape));
      if (bytes > 0) // an empty tensor's data() may be null
        readData(e.begin, bytes, reinterpret_cast<char*>(tensor.data()));
      tensors.emplace(e.name, std::move(tensor));
    }
  }
  dequantize(path, quantized, tensors);
  return tensors;
}

// readEntries's `borrow` for a file whose tensors all get memory of their own.
std::optional<BorrowedFloats> copyEveryTensor(uint64_t, size_t) {
  return std::nullopt;
}

} // namespace

TensorMap readSafeTensors(const std::string& path, TensorReading reading) {
  std::unique_ptr<PositionalFile> file = PositionalFile::open(path);
  if (!file) { // a pipe: read whole
    FileBytes bytes = mapFileBytes(path);
    return parseSafeTensors(bytes.view(), path);
  }
  // Each tensor read straight into its own storage (ir/FileIO.h, PositionalFile).
  char first8[8] = {};
  if (file->size() >= 8)
    file->read(0, first8, 8);
  const uint64_t headerLength =
      checkedHeaderLength(path, std::string_view(first8, 8), file->size());
  std::string header(headerLength, '\0');
  file->read(8, header.data(), headerLength);
  const uint64_t dataStart = 8 + headerLength;
  std::vector<Entry> entries = parseEntries(path, header, file->size() - dataStart);
  std::shared_ptr<const FileMapping> mapping;
  if (reading == TensorReading::inPlace)
    mapping = file->mapPrivately();
  if (!mapping)
    return readEntries(
        path, entries,
        [&](uint64_t begin, size_t bytes, char* into) {
          file->read(dataStart + begin, into, bytes);
        },
        copyEveryTensor);
  // Offsets were checked against the file's size when it was opened, which the mapping has.
  char* data = mapping->data() + dataStart;
  return readEntries(
      path, entries,
      [&](uint64_t begin, size_t bytes, char* into) { std::memcpy(into, data + begin, bytes); },
      [&](uint64_t begin, size_t count) -> std::optional<BorrowedFloats> {
        char* at = data + begin;
        if (count == 0 || reinterpret_cast<std::uintptr_t>(at) % alignof(float) != 0)
          return std::nullopt;
        return BorrowedFloats{mapping, reinterpret_cast<float*>(at), count};
      });
}

TensorMap parseSafeTensors(std::string_view bytes, const std::string& path) {
  const uint64_t headerLength = checkedHeaderLength(path, bytes, bytes.size());
  std::string_view data = bytes.substr(8 + headerLength);
  std::vector<Entry> entries = parseEntries(path, bytes.substr(8, headerLength), data.size());
  return readEntries(
      path, entries,
      [&](uint64_t begin, size_t count, char* into) {
        std::memcpy(into, data.data() + begin, count);
      },
      copyEveryTensor);
}

void writeSafeTensors(const std::string& path, const TensorMap& tensors) {
  // TensorMap is sorted by name, so the data section is laid out in name order.
  json header = json::object();
  std::vector<std::string_view> chunks = {"", ""}; // length and header, filled in below
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey)
      failIn(path, fmt::format("cannot write a tensor named '{}': the name is reserved", name));
    // A default-constructed Tensor has shape [] but no value; it must not reach a file.
    RNNC_INTERNAL_CHECK(static_cast<size_t>(numElements(tensor.shape())) == tensor.values().size(),
                        "tensor '" + name + "' does not match its shape " + tensor.shapeString());
    uint64_t size = tensor.values().size() * sizeof(float);
    header[name] = {{"dtype", "F32"},
                    {"shape", tensor.shape()},
                    {"data_offsets", json::array({offset, offset + size})}};
    offset += size;
    chunks.emplace_back(reinterpret_cast<const char*>(tensor.data()), size);
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const json::type_error&) {
    // The only way dump() fails: a name that is not valid UTF-8, which JSON cannot hold.
    failIn(path, "cannot write safetensors: a tensor name is not valid UTF-8");
  }
  // Pad with spaces so that the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string length = u64Bytes(text.size());
  chunks[0] = length;
  chunks[1] = text;
  writeFileBytes(path, chunks);
}

} // namespace rnnc
