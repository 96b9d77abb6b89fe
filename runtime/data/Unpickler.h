// A restricted reader of Python's pickle format (protocols 2 to 5, the binary opcodes), for the
// pickles in PyTorch's torch.save archives. It runs no code: GLOBAL only names a callable, and
// REDUCE, NEWOBJ and persistent ids go to a resolver (TorchCheckpoint.cpp makes tensors of
// torch's rebuild functions and leaves every other call an opaque object). Values live in one
// arena and refer to each other by index, so a pickle whose memo makes a cycle is read (and freed)
// like any other. A malformed pickle is a UserError naming the file and the byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rnnc {

struct PickleValue {
  enum class Kind : uint8_t {
    none,
    boolean,
    integer,
    real,
    string,
    bytes,
    tuple,
    list,
    dict,
    global,
    object
  };
  Kind kind = Kind::none;
  int64_t integer = 0; // boolean, integer; object: the resolver's own index
  double real = 0;
  std::string text = {}; // string, bytes; global: "module.name"; object: the callable's name
  std::vector<int32_t> items = {}; // tuple, list; dict: key, value, key, value, ...
};

class PickleResolver;

struct Pickle {
  std::vector<PickleValue> values;
  int32_t root = -1;
  const PickleValue& at(int32_t index) const { return values[static_cast<size_t>(index)]; }
  // Appends `value`; its index.
  int32_t add(PickleValue value) {
    values.push_back(std::move(value));
    return static_cast<int32_t>(values.size() - 1);
  }
};

class PickleResolver {
public:
  virtual ~PickleResolver() = default;
  // The value of `callable` (a global's "module.name") called with the tuple `args`: an index
  // into pickle.values (a new value appended there, or one of its arguments).
  virtual int32_t call(Pickle& pickle, const std::string& callable, int32_t args) = 0;
  // The object a persistent id (BINPERSID) stands for.
  virtual int32_t persistentLoad(Pickle& pickle, int32_t id) = 0;
};

// `path` names the file in messages.
Pickle unpickle(std::string_view bytes, PickleResolver& resolver, const std::string& path);

} // namespace rnnc
