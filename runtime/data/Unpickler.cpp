// The pickle machine (Python's Lib/pickletools.py documents every opcode): a stack of values, a
// mark stack, and a memo the pickle fills and reads by index. Only the binary opcodes that
// protocols 2-5 write for plain data, globals and reductions are read; the text opcodes of
// protocols 0 and 1, and anything else, are an error naming the opcode.
#include "runtime/data/Unpickler.h"

#include "ir/Error.h"

#include <bit>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

namespace rnnc {
namespace {

class Machine {
public:
  Machine(std::string_view bytes, PickleResolver& resolver, const std::string& path)
      : bytes_(bytes), resolver_(resolver), path_(path) {}

  Pickle run() {
    while (true) {
      opcodeAt_ = at_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') {
        if (stack_.size() != 1)
          fail(fmt::format("STOP with {} values on the stack, not 1", stack_.size()));
        pickle_.root = stack_.back();
        return std::move(pickle_);
      }
      step(op);
    }
  }

private:
  [[noreturn]] void fail(const std::string& message) const {
    throw UserError(fmt::format("{}: malformed pickle (byte {}): {}", path_, opcodeAt_, message));
  }

  std::string_view take(uint64_t count) {
    if (count > bytes_.size() - at_)
      fail("the pickle ends in the middle of an opcode");
    std::string_view taken = bytes_.substr(at_, count);
    at_ += count;
    return taken;
  }
  uint64_t little(int width) {
    std::string_view b = take(width);
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i)
      value = value << 8 | static_cast<unsigned char>(b[i]);
    return value;
  }
  std::string line() { // GLOBAL's "module\n" and "name\n"
    const size_t end = bytes_.find('\n', at_);
    if (end == std::string_view::npos)
      fail("GLOBAL without a newline");
    std::string text(bytes_.substr(at_, end - at_));
    at_ = end + 1;
    return text;
  }

  int32_t add(PickleValue value) {
    if (pickle_.values.size() >= static_cast<size_t>(INT32_MAX))
      fail("too many values");
    return pickle_.add(std::move(value));
  }
  void push(int32_t v) { stack_.push_back(v); }
  int32_t pop() {
    if (stack_.size() <= floor())
      fail("a value is taken from an empty stack (or past a mark)");
    int32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  int32_t top() {
    if (stack_.size() <= floor())
      fail("the stack is empty");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<int32_t> popToMark() {
    if (marks_.empty())
      fail("no mark to pop to");
    std::vector<int32_t> items(stack_.begin() + static_cast<ptrdiff_t>(marks_.back()),
                               stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  PickleValue& value(int32_t index) { return pickle_.values[static_cast<size_t>(index)]; }
  PickleValue& expect(int32_t index, PickleValue::Kind kind, const char* what) {
    PickleValue& v = value(index);
    if (v.kind != kind)
      fail(fmt::format("{} is applied to a value of another kind", what));
    return v;
  }

  int32_t text(PickleValue::Kind kind, uint64_t count) {
    return add({.kind = kind, .text = std::string(take(count))});
  }
  int32_t integer(int64_t n) { return add({.kind = PickleValue::Kind::integer, .integer = n}); }
  int32_t longInteger(uint64_t count) { // two's complement, little-endian
    if (count > 8)
      fail(fmt::format("an integer of {} bytes", count));
    if (count == 0)
      return integer(0);
    uint64_t raw = little(static_cast<int>(count));
    if (count < 8 && (raw >> (8 * count - 1)) & 1u)
      raw |= ~uint64_t{0} << (8 * count);
    return integer(static_cast<int64_t>(raw));
  }
  int32_t sequence(PickleValue::Kind kind, std::vector<int32_t> items) {
    return add({.kind = kind, .items = std::move(items)});
  }
  int32_t global(std::string module, const std::string& name) {
    return add({.kind = PickleValue::Kind::global, .text = std::move(module) + "." + name});
  }
  void appendTo(int32_t list, const std::vector<int32_t>& items) {
    PickleValue& l = value(list);
    if (l.kind != PickleValue::Kind::list && l.kind != PickleValue::Kind::object)
      fail("APPEND to a value that is not a list");
    if (l.kind == PickleValue::Kind::list)
      l.items.insert(l.items.end(), items.begin(), items.end());
  }
  void setItems(int32_t dict, const std::vector<int32_t>& pairs) {
    if (pairs.size() % 2 != 0)
      fail("SETITEMS with a key and no value");
    PickleValue& d = value(dict);
    if (d.kind != PickleValue::Kind::dict && d.kind != PickleValue::Kind::object)
      fail("SETITEM on a value that is not a dict");
    if (d.kind == PickleValue::Kind::dict)
      d.items.insert(d.items.end(), pairs.begin(), pairs.end());
  }
  void memoize(uint64_t index) {
    if (index > bytes_.size()) // a pickle cannot fill more memo slots than it has bytes
      fail(fmt::format("memo index {}", index));
    memo_[index] = top();
  }
  int32_t recall(uint64_t index) {
    auto found = memo_.find(index);
    if (found == memo_.end())
      fail(fmt::format("memo entry {} was never stored", index));
    return found->second;
  }
  void call(int32_t callable, int32_t args) {
    const PickleValue& c = value(callable);
    if (c.kind != PickleValue::Kind::global)
      fail("REDUCE of a value that is not a global");
    expect(args, PickleValue::Kind::tuple, "REDUCE");
    const std::string name = c.text;
    push(resolver_.call(pickle_, name, args));
  }

  void step(unsigned char op) {
    using K = PickleValue::Kind;
    switch (op) {
    case 0x80: // PROTO
      if (static_cast<unsigned char>(take(1)[0]) > 5)
        fail("a pickle protocol past 5");
      return;
    case 0x95: // FRAME: a length to read ahead, nothing to do here
      take(8);
      return;
    case '(':
      marks_.push_back(stack_.size());
      return;
    case '0':
      pop();
      return;
    case '1':
      popToMark();
      return;
    case '2':
      push(top());
      return;
    case 'N':
      push(add({.kind = K::none}));
      return;
    case 0x88:
    case 0x89:
      push(add({.kind = K::boolean, .integer = op == 0x88}));
      return;
    case 'J':
      push(integer(static_cast<int32_t>(little(4))));
      return;
    case 'K':
      push(integer(static_cast<int64_t>(little(1))));
      return;
    case 'M':
      push(integer(static_cast<int64_t>(little(2))));
      return;
    case 0x8a:
      push(longInteger(little(1)));
      return;
    case 0x8b:
      push(longInteger(little(4)));
      return;
    case 'G': { // big-endian double
      std::string_view b = take(8);
      uint64_t raw = 0;
      for (char c : b)
        raw = raw << 8 | static_cast<unsigned char>(c);
      push(add({.kind = K::real, .real = std::bit_cast<double>(raw)}));
      return;
    }
    case 'X':
    case 'T':
      push(text(K::string, little(4))); // BINUNICODE, or BINSTRING (a Python 2 str)
      return;
    case 0x8c:
    case 'U':
      push(text(K::string, little(1))); // SHORT_BINUNICODE, or SHORT_BINSTRING
      return;
    case 0x8d:
      push(text(K::string, little(8)));
      return;
    case 'B':
      push(text(K::bytes, little(4)));
      return;
    case 'C':
      push(text(K::bytes, little(1)));
      return;
    case 0x8e:
      push(text(K::bytes, little(8)));
      return;
    case ')':
      push(sequence(K::tuple, {}));
      return;
    case 't':
      push(sequence(K::tuple, popToMark()));
      return;
    case 0x85:
    case 0x86:
    case 0x87: {
      std::vector<int32_t> items(static_cast<size_t>(op - 0x84));
      for (size_t i = items.size(); i-- > 0;)
        items[i] = pop();
      push(sequence(K::tuple, std::move(items)));
      return;
    }
    case ']':
    case 0x8f: // EMPTY_SET, read as a list
      push(sequence(K::list, {}));
      return;
    case 'l':
    case 0x91: // FROZENSET
      push(sequence(K::list, popToMark()));
      return;
    case 'a': {
      int32_t item = pop();
      appendTo(top(), {item});
      return;
    }
    case 'e':
    case 0x90: { // APPENDS, ADDITEMS
      std::vector<int32_t> items = popToMark();
      appendTo(top(), items);
      return;
    }
    case '}':
      push(sequence(K::dict, {}));
      return;
    case 'd':
      push(sequence(K::dict, popToMark()));
      if (value(stack_.back()).items.size() % 2 != 0)
        fail("DICT with a key and no value");
      return;
    case 's': {
      int32_t v = pop(), k = pop();
      setItems(top(), {k, v});
      return;
    }
    case 'u': {
      std::vector<int32_t> pairs = popToMark();
      setItems(top(), pairs);
      return;
    }
    case 'c': {
      std::string module = line();
      push(global(std::move(module), line()));
      return;
    }
    case 0x93: { // STACK_GLOBAL
      int32_t name = pop(), module = pop();
      if (value(module).kind != K::string || value(name).kind != K::string)
        fail("STACK_GLOBAL of values that are not strings");
      push(global(value(module).text, value(name).text));
      return;
    }
    case 'R': {
      int32_t args = pop(), callable = pop();
      call(callable, args);
      return;
    }
    case 0x81: { // NEWOBJ: cls.__new__(cls, *args)
      int32_t args = pop(), cls = pop();
      call(cls, args);
      return;
    }
    case 0x92: { // NEWOBJ_EX: keyword arguments besides
      pop();
      int32_t args = pop(), cls = pop();
      call(cls, args);
      return;
    }
    case 'b': // BUILD: an object's state (OrderedDict's _metadata: nothing rnnc reads)
      pop();
      top();
      return;
    case 'Q': {
      int32_t id = pop();
      push(resolver_.persistentLoad(pickle_, id));
      return;
    }
    case 'q':
      memoize(little(1));
      return;
    case 'r':
      memoize(little(4));
      return;
    case 0x94:
      memoize(memo_.size());
      return;
    case 'h':
      push(recall(little(1)));
      return;
    case 'j':
      push(recall(little(4)));
      return;
    default:
      fail(fmt::format("opcode 0x{:02x} is not one rnnc reads (it reads protocols 2-5 of plain "
                       "data, as torch.save writes them)",
                       op));
    }
  }

  std::string_view bytes_;
  PickleResolver& resolver_;
  const std::string& path_;
  uint64_t at_ = 0, opcodeAt_ = 0;
  Pickle pickle_;
  std::vector<int32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, int32_t> memo_;
};

} // namespace

Pickle unpickle(std::string_view bytes, PickleResolver& resolver, const std::string& path) {
  return Machine(bytes, resolver, path).run();
}

} // namespace rnnc
