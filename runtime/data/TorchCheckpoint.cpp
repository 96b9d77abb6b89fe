// torch.save's archive: NAME/data.pkl, the pickled object, in which each tensor is a call of
// torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
// backward_hooks) and each storage a persistent id ('storage', torch.FloatStorage, key,
// location, numel) whose bytes are the entry NAME/data/KEY (little-endian, as NAME/byteorder
// says where it is present); nn.Parameter wraps a tensor in _rebuild_parameter.
#include "runtime/data/TorchCheckpoint.h"

#include "ir/Error.h"
#include "runtime/data/Unpickler.h"
#include "runtime/data/ZipArchive.h"

#include <Eigen/Core>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include <fmt/format.h>

namespace rnnc {
namespace {

enum class Scalar { f32, f64, f16, bf16, other };

struct StorageType {
  const char* name;
  Scalar element;
  int64_t bytes;
};

constexpr StorageType kStorageTypes[] = {{"torch.FloatStorage", Scalar::f32, 4},
                                         {"torch.DoubleStorage", Scalar::f64, 8},
                                         {"torch.HalfStorage", Scalar::f16, 2},
                                         {"torch.BFloat16Storage", Scalar::bf16, 2},
                                         {"torch.LongStorage", Scalar::other, 8},
                                         {"torch.IntStorage", Scalar::other, 4},
                                         {"torch.ShortStorage", Scalar::other, 2},
                                         {"torch.CharStorage", Scalar::other, 1},
                                         {"torch.ByteStorage", Scalar::other, 1},
                                         {"torch.BoolStorage", Scalar::other, 1},
                                         {"torch.ComplexFloatStorage", Scalar::other, 8},
                                         {"torch.ComplexDoubleStorage", Scalar::other, 16}};

struct Storage {
  std::string key;
  Scalar element = Scalar::other;
  int64_t elementBytes = 1, numel = 0;
};

struct TensorRecord {
  int64_t storage = 0, offset = 0;
  TensorShape size, stride;
};

constexpr const char* kTensorObject = "torch._utils._rebuild_tensor_v2";
constexpr const char* kStorageObject = "<storage>";
constexpr int kMaxNesting = 64;

// Makes tensors of torch's rebuild functions and storages of persistent ids; every other call
// an opaque object (a checkpoint's argparse.Namespace, a pickled module) that names its callable.
class TorchResolver : public PickleResolver {
public:
  explicit TorchResolver(const std::string& path) : path_(path) {}

  int32_t call(Pickle& p, const std::string& callable, int32_t args) override {
    const std::vector<int32_t> a = p.at(args).items;
    if (callable == "collections.OrderedDict") {
      if (!a.empty())
        fail("OrderedDict is called with arguments");
      return p.add({.kind = PickleValue::Kind::dict});
    }
    if (callable == "torch._utils._rebuild_tensor_v2" || callable == "torch._utils._rebuild_tensor")
      return rebuildTensor(p, a);
    if (callable == "torch._utils._rebuild_parameter" ||
        callable == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || !isTensor(p, a[0]))
        fail(callable + " is called without a tensor");
      return a[0];
    }
    return p.add({.kind = PickleValue::Kind::object, .integer = -1, .text = callable});
  }

  int32_t persistentLoad(Pickle& p, int32_t id) override {
    const std::vector<int32_t> t = p.at(id).items;
    if (p.at(id).kind != PickleValue::Kind::tuple || t.size() != 5 ||
        p.at(t[0]).text != "storage" || p.at(t[1]).kind != PickleValue::Kind::global ||
        p.at(t[2]).kind != PickleValue::Kind::string ||
        p.at(t[4]).kind != PickleValue::Kind::integer || p.at(t[4]).integer < 0)
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    Storage s;
    s.key = p.at(t[2]).text;
    s.numel = p.at(t[4]).integer;
    // An unknown type stays a storage of bytes (Storage's defaults) whose tensors are skipped.
    for (const StorageType& candidate : kStorageTypes)
      if (p.at(t[1]).text == candidate.name) {
        s.element = candidate.element;
        s.elementBytes = candidate.bytes;
      }
    auto [found, added] = storageByKey_.emplace(s.key, static_cast<int64_t>(storages.size()));
    if (added)
      storages.push_back(std::move(s));
    return p.add(
        {.kind = PickleValue::Kind::object, .integer = found->second, .text = kStorageObject});
  }

  static bool isTensor(const Pickle& p, int32_t v) {
    return p.at(v).kind == PickleValue::Kind::object && p.at(v).text == kTensorObject;
  }

  std::vector<Storage> storages;
  std::vector<TensorRecord> tensors;

private:
  [[noreturn]] void fail(const std::string& message) const {
    throw UserError(fmt::format("{}: not a torch.save archive rnnc can read: {}", path_, message));
  }

  TensorShape integers(const Pickle& p, int32_t v, const char* what) const {
    if (p.at(v).kind != PickleValue::Kind::tuple)
      fail(fmt::format("a tensor's {} is not a tuple", what));
    TensorShape values;
    for (int32_t item : p.at(v).items) {
      if (p.at(item).kind != PickleValue::Kind::integer || p.at(item).integer < 0)
        fail(fmt::format("a tensor's {} holds something other than a count", what));
      values.push_back(p.at(item).integer);
    }
    return values;
  }

  int32_t rebuildTensor(Pickle& p, const std::vector<int32_t>& a) {
    if (a.size() < 4 || p.at(a[0]).kind != PickleValue::Kind::object ||
        p.at(a[0]).text != kStorageObject || p.at(a[1]).kind != PickleValue::Kind::integer)
      fail("a tensor rebuilt from something other than (storage, offset, size, stride, ...)");
    TensorRecord t;
    t.storage = p.at(a[0]).integer;
    t.offset = p.at(a[1]).integer;
    t.size = integers(p, a[2], "size");
    t.stride = integers(p, a[3], "stride");
    if (t.offset < 0 || t.size.size() != t.stride.size())
      fail("a tensor's offset is negative, or its size and stride differ in length");
    tensors.push_back(std::move(t));
    return p.add({.kind = PickleValue::Kind::object,
                  .integer = static_cast<int64_t>(tensors.size() - 1),
                  .text = kTensorObject});
  }

  const std::string& path_;
  std::map<std::string, int64_t> storageByKey_;
};

float toFloat(const char* at, Scalar element) {
  switch (element) {
  case Scalar::f32: {
    float v;
    std::memcpy(&v, at, 4);
    return v;
  }
  case Scalar::f64: {
    double v;
    std::memcpy(&v, at, 8);
    return static_cast<float>(v);
  }
  case Scalar::f16: {
    uint16_t bits;
    std::memcpy(&bits, at, 2);
    return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
  }
  case Scalar::bf16: {
    uint16_t bits;
    std::memcpy(&bits, at, 2);
    return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
  }
  case Scalar::other:
    break;
  }
  return 0;
}

// The tensor's values as float32, after checking that every element it reaches lies in its
// storage (the archive's entry `storage`): read straight into the tensor where it is float32 in
// row-major order, as a state_dict's tensors almost always are; else the span of the storage it
// reaches, converted element by element.
Tensor materialize(const TensorRecord& t, const Storage& s, const ZipEntry& storage,
                   const ByteSource& source, const std::string& path, const std::string& name) {
  auto fail = [&](const std::string& message) {
    throw UserError(fmt::format("{}: tensor '{}': {}", path, name, message));
  };
  if (static_cast<uint64_t>(s.numel) > storage.size / static_cast<uint64_t>(s.elementBytes))
    fail(fmt::format("its storage '{}' holds {} bytes, not the {} elements of {} bytes it says",
                     s.key, storage.size, s.numel, s.elementBytes));
  for (int64_t size : t.size)
    if (size == 0)
      return Tensor::uninitialized(t.size);
  if (t.offset >= s.numel)
    fail(fmt::format("offset {} is past its storage of {} elements", t.offset, s.numel));
  int64_t count = 1, last = t.offset; // the element furthest into the storage, < s.numel
  for (size_t d = 0; d < t.size.size(); ++d) {
    const int64_t size = t.size[d], stride = t.stride[d];
    // Past its storage: more elements than the storage has (so an expanded tensor, whose stride
    // 0 repeats elements, is refused too), or an element beyond its end.
    const bool tooMany = size > s.numel || count > s.numel / size;
    const bool beyond = stride > 0 && size - 1 > (s.numel - 1 - last) / stride;
    if (tooMany || beyond)
      fail(fmt::format("size {}, stride {} and offset {} reach past its storage of {} elements",
                       shapeToString(t.size), shapeToString(t.stride), t.offset, s.numel));
    count *= size;
    last += (size - 1) * stride;
  }
  bool contiguous = true;
  for (int64_t d = static_cast<int64_t>(t.size.size()) - 1, step = 1; d >= 0; --d) {
    contiguous = contiguous && (t.size[d] == 1 || t.stride[d] == step);
    step *= t.size[d];
  }
  Tensor tensor = Tensor::uninitialized(t.size);
  float* out = tensor.data();
  if (contiguous && s.element == Scalar::f32) {
    source.read(storage.offset + static_cast<uint64_t>(t.offset) * 4,
                static_cast<size_t>(count) * 4, reinterpret_cast<char*>(out));
    return tensor;
  }
  const std::string span =
      source.readString(storage.offset + static_cast<uint64_t>(t.offset * s.elementBytes),
                        static_cast<size_t>((last - t.offset + 1) * s.elementBytes));
  const int64_t rank = static_cast<int64_t>(t.size.size());
  std::vector<int64_t> index(t.size.size(), 0);
  int64_t at = 0; // elements past t.offset
  for (int64_t i = 0; i < count; ++i) {
    out[i] = toFloat(span.data() + at * s.elementBytes, s.element);
    for (int64_t d = rank - 1; d >= 0; --d) { // the next index, last dimension fastest
      if (++index[d] < t.size[d]) {
        at += t.stride[d];
        break;
      }
      at -= (t.size[d] - 1) * t.stride[d];
      index[d] = 0;
    }
  }
  return tensor;
}

// The floating-point tensors under `value`, named by the keys on the way; each container is
// walked once (a pickle may share one between places, or nest one in itself).
class Flattener {
public:
  Flattener(const Pickle& p, const TorchResolver& r, const std::map<std::string, ZipEntry>& entries,
            const ByteSource& source, const std::string& prefix, const std::string& path)
      : p_(p), r_(r), entries_(entries), source_(source), prefix_(prefix), path_(path) {}

  void walk(int32_t value, const std::string& name, int depth) {
    const PickleValue& v = p_.at(value);
    if (TorchResolver::isTensor(p_, value))
      return add(name, r_.tensors[static_cast<size_t>(v.integer)]);
    const bool container = v.kind == PickleValue::Kind::dict || v.kind == PickleValue::Kind::list ||
                           v.kind == PickleValue::Kind::tuple;
    if (!container || depth >= kMaxNesting || !walked_.insert(value).second)
      return;
    const std::string dot = name.empty() ? "" : name + ".";
    if (v.kind == PickleValue::Kind::dict) {
      for (size_t i = 0; i + 1 < v.items.size(); i += 2) {
        const PickleValue& key = p_.at(v.items[i]);
        if (key.kind == PickleValue::Kind::string)
          walk(v.items[i + 1], dot + key.text, depth + 1);
        else if (key.kind == PickleValue::Kind::integer)
          walk(v.items[i + 1], dot + std::to_string(key.integer), depth + 1);
      }
      return;
    }
    for (size_t i = 0; i < v.items.size(); ++i)
      walk(v.items[i], dot + std::to_string(i), depth + 1);
  }

  TensorMap tensors;

private:
  void add(const std::string& name, const TensorRecord& t) {
    const Storage& s = r_.storages[static_cast<size_t>(t.storage)];
    if (s.element == Scalar::other)
      return; // integer, bool, complex or unknown: not a weight
    auto entry = entries_.find(prefix_ + "data/" + s.key);
    if (entry == entries_.end())
      throw UserError(fmt::format("{}: tensor '{}': its storage '{}' is not in the archive", path_,
                                  name, s.key));
    if (!tensors.emplace(name, materialize(t, s, entry->second, source_, path_, name)).second)
      throw UserError(fmt::format("{}: two tensors are named '{}'", path_, name));
  }

  const Pickle& p_;
  const TorchResolver& r_;
  const std::map<std::string, ZipEntry>& entries_;
  const ByteSource& source_;
  const std::string& prefix_;
  const std::string& path_;
  std::set<int32_t> walked_;
};

// The archive's folder ("NAME/"), by its data.pkl; a TorchScript archive is refused here.
std::string archiveFolder(const ZipEntries& zip, const ByteSource& source,
                          const std::string& path) {
  std::set<std::string> names = zip.compressed;
  for (const auto& [name, bytes] : zip.stored)
    names.insert(name);
  std::string folder;
  bool found = false;
  for (const std::string& name : names) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos)
      continue;
    if (name.compare(slash + 1, std::string::npos, "data.pkl") == 0 && !found) {
      folder = name.substr(0, slash + 1);
      found = true;
    }
  }
  if (!found)
    throw UserError(fmt::format("{}: a zip archive without NAME/data.pkl: not a file of "
                                "torch.save",
                                path));
  for (const std::string& name : names)
    if (name.rfind(folder + "code/", 0) == 0 || name.rfind(folder + "constants.pkl", 0) == 0)
      throw UserError(fmt::format("{}: a TorchScript archive (torch.jit.save): rnnc reads "
                                  "state_dicts; save one with torch.save(model.state_dict(), "
                                  "PATH)",
                                  path));
  if (!zip.compressed.empty())
    throw UserError(fmt::format("{}: entry '{}' is compressed: torch.save stores its entries "
                                "uncompressed, and rnnc reads them so",
                                path, *zip.compressed.begin()));
  auto order = zip.stored.find(folder + "byteorder");
  if (order != zip.stored.end()) {
    const std::string byteOrder =
        source.readString(order->second.offset, std::min<uint64_t>(order->second.size, 16));
    if (byteOrder != "little")
      throw UserError(
          fmt::format("{}: its tensors are stored in byte order '{}'; rnnc reads little-endian",
                      path, byteOrder));
  }
  return folder;
}

} // namespace

// The legacy format starts with a pickle (protocol 2) of its magic number, a 10-byte LONG1.
static bool looksLikeLegacyTorchSave(std::string_view bytes) {
  return bytes.size() >= 4 && bytes.substr(0, 4) == std::string_view("\x80\x02\x8a\x0a", 4);
}

bool looksLikeTorchCheckpoint(std::string_view bytes) {
  return looksLikeZip(bytes) || looksLikeLegacyTorchSave(bytes);
}

TensorMap readTorchCheckpoint(const ByteSource& source, const std::string& path) {
  const std::string start = source.readString(0, std::min<uint64_t>(source.size(), 4));
  if (!looksLikeZip(start)) {
    if (looksLikeLegacyTorchSave(start))
      throw UserError(fmt::format(
          "{}: torch.save's legacy format (PyTorch before 1.6, or "
          "_use_new_zipfile_serialization=False): save it again with a current torch.save, or "
          "as safetensors (rnnc.save_safetensors)",
          path));
    throw UserError(fmt::format("{}: not a torch.save archive (no zip header)", path));
  }
  const ZipEntries zip = readZipEntries(source, path);
  const std::string folder = archiveFolder(zip, source, path);
  const ZipEntry& pickled = zip.stored.at(folder + "data.pkl");
  TorchResolver resolver(path);
  const Pickle pickle = unpickle(
      source.readString(pickled.offset, static_cast<size_t>(pickled.size)), resolver, path);
  const PickleValue& root = pickle.at(pickle.root);
  if (TorchResolver::isTensor(pickle, pickle.root))
    throw UserError(fmt::format("{}: holds one tensor, not a state_dict (a dict of tensors by "
                                "name): save {{\"NAME\": tensor}}",
                                path));
  if (root.kind == PickleValue::Kind::object)
    throw UserError(fmt::format(
        "{}: holds a pickled {} (a whole object saved with torch.save), not a state_dict: save "
        "model.state_dict() instead (rnnc reads tensors in dicts, and runs no pickled code)",
        path, root.text));
  Flattener flattener(pickle, resolver, zip.stored, source, folder, path);
  flattener.walk(pickle.root, "", 0);
  if (flattener.tensors.empty())
    throw UserError(fmt::format("{}: no floating-point tensors in it (rnnc reads the "
                                "float32, float64, float16 and bfloat16 tensors of a state_dict)",
                                path));
  return std::move(flattener.tensors);
}

TensorMap parseTorchCheckpoint(std::string_view bytes, const std::string& path) {
  return readTorchCheckpoint(MemorySource(bytes), path);
}

} // namespace rnnc
