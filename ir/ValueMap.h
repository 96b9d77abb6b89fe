// Per-value bookkeeping for the passes (a value's dependence, its uses, whether it is live, its
// number): a hash map from IR values to small data, open addressing on the pointer, in two flat
// arrays. std::unordered_map allocates a node per entry; the passes build such maps over the
// whole cell again and again (after every rewrite), and malloc and free were a quarter of the
// pipeline's time (`rnnc_bench --benchmark_filter=passPipeline`). Entries are never removed.
#pragma once

#include "ir/Error.h"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rnnc::ir {

class Value;

template <class T> class ValueMap {
public:
  // Room for `expected` values before the first growth.
  explicit ValueMap(size_t expected = 32) { reset(std::bit_ceil(expected * 2 + 2)); }

  // The value's entry, default-constructed when it had none. Not for null, which marks an
  // empty slot (and which find() never finds).
  T& operator[](const Value* key) {
    RNNC_INTERNAL_CHECK(key != nullptr, "a null value as a key");
    size_t i = slot(key);
    if (!keys_[i]) {
      if ((size_ + 1) * 4 > keys_.size() * 3) { // over three quarters full
        grow();
        i = slot(key);
      }
      keys_[i] = key;
      ++size_;
    }
    return values_[i];
  }

  // The value's entry, or null.
  T* find(const Value* key) {
    const size_t i = slot(key);
    return keys_[i] ? &values_[i] : nullptr;
  }
  const T* find(const Value* key) const {
    const size_t i = slot(key);
    return keys_[i] ? &values_[i] : nullptr;
  }
  const T& at(const Value* key) const {
    const T* found = find(key);
    RNNC_INTERNAL_CHECK(found, "a value the pass has not seen");
    return *found;
  }
  bool contains(const Value* key) const { return keys_[slot(key)] != nullptr; }
  size_t size() const { return size_; }

private:
  void reset(size_t capacity) {
    keys_.assign(capacity, nullptr);
    values_.assign(capacity, T{});
    size_ = 0;
  }

  // Where `key` is, or the empty slot where it would go (the table is never full).
  size_t slot(const Value* key) const {
    const size_t mask = keys_.size() - 1;
    // Fibonacci hashing of the address: objects are 8- or 16-byte aligned, so the low bits
    // alone would crowd a few slots.
    size_t i = static_cast<size_t>(
                   (reinterpret_cast<uintptr_t>(key) >> 3) * uint64_t{0x9E3779B97F4A7C15} >> 20) &
               mask;
    while (keys_[i] && keys_[i] != key)
      i = (i + 1) & mask;
    return i;
  }

  void grow() {
    std::vector<const Value*> keys = std::move(keys_);
    std::vector<T> values = std::move(values_);
    reset(keys.size() * 2);
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i])
        (*this)[keys[i]] = std::move(values[i]);
  }

  std::vector<const Value*> keys_;
  std::vector<T> values_;
  size_t size_ = 0;
};

// Which values are in a set (live, defined, seen).
class ValueSet {
public:
  explicit ValueSet(size_t expected = 32) : members_(expected) {}
  // Whether it was new; null is no value, never a member.
  bool insert(const Value* value) {
    if (!value)
      return false;
    const size_t before = members_.size();
    members_[value] = 1;
    return members_.size() != before;
  }
  bool contains(const Value* value) const { return members_.contains(value); }
  size_t size() const { return members_.size(); }

private:
  ValueMap<unsigned char> members_; // not bool: std::vector<bool> has no references
};

} // namespace rnnc::ir
