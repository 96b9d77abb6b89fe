#include "ir/Dim.h"

#include "ir/Error.h"

#include <string>

namespace rnnc::ir {
namespace {

// Sizes are int64_t; arithmetic past that range would wrap into a plausible size
// (4611686018427387905*4 is 4), so it is an error instead.
[[noreturn]] void overflow(int64_t a, const char* op, int64_t b) {
  throw UserError("size arithmetic overflows: " + std::to_string(a) + " " + op + " " +
                  std::to_string(b) + " is outside the 64-bit range sizes have");
}

int64_t add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    overflow(a, "+", b);
  return r;
}

int64_t multiply(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    overflow(a, "*", b);
  return r;
}

} // namespace

Dim Dim::constant(int64_t value) {
  Dim d;
  d.offset_ = value;
  return d;
}

Dim Dim::symbol(const std::string& name, int64_t coefficient) {
  Dim d;
  d.terms_[name] = coefficient;
  d.normalize();
  return d;
}

void Dim::normalize() {
  for (auto it = terms_.begin(); it != terms_.end();)
    it = it->second == 0 ? terms_.erase(it) : std::next(it);
}

Dim Dim::operator+(const Dim& other) const {
  Dim d = *this;
  for (const auto& [name, coeff] : other.terms_)
    d.terms_[name] = add(d.terms_[name], coeff);
  d.offset_ = add(d.offset_, other.offset_);
  d.normalize();
  return d;
}

Dim Dim::operator-(const Dim& other) const {
  return *this + other * -1;
}

Dim Dim::operator*(int64_t factor) const {
  Dim d = *this;
  for (auto& [name, coeff] : d.terms_)
    coeff = multiply(coeff, factor);
  d.offset_ = multiply(d.offset_, factor);
  d.normalize();
  return d;
}

std::optional<Dim> Dim::exactlyDividedBy(int64_t n) const {
  if (n <= 0 || offset_ % n != 0)
    return std::nullopt;
  Dim d;
  d.offset_ = offset_ / n;
  for (const auto& [name, coeff] : terms_) {
    if (coeff % n != 0)
      return std::nullopt;
    d.terms_[name] = coeff / n;
  }
  return d;
}

bool Dim::isProvablyNonNegative() const {
  if (offset_ < 0)
    return false;
  for (const auto& term : terms_)
    if (term.second < 0)
      return false;
  return true;
}

bool Dim::isProvablyPositive() const {
  return isProvablyNonNegative() && (offset_ > 0 || !terms_.empty());
}

Dim Dim::substitute(const SizeMap& sizes) const {
  Dim d;
  d.offset_ = offset_;
  for (const auto& [name, coeff] : terms_) {
    auto it = sizes.find(name);
    if (it != sizes.end())
      d.offset_ = add(d.offset_, multiply(coeff, it->second));
    else
      d.terms_[name] = coeff;
  }
  return d;
}

std::optional<int64_t> Dim::evaluate(const SizeMap& sizes) const {
  Dim d = substitute(sizes);
  if (!d.isConstant())
    return std::nullopt;
  return d.offset_;
}

std::string Dim::str() const {
  std::string out;
  // The batch symbol reads best first; map order puts it first anyway since 'B' < lower case.
  for (const auto& [name, coeff] : terms_) {
    int64_t magnitude = coeff < 0 ? -coeff : coeff;
    if (out.empty())
      out += coeff < 0 ? "-" : "";
    else
      out += coeff < 0 ? " - " : " + ";
    if (magnitude != 1)
      out += std::to_string(magnitude) + "*";
    out += name;
  }
  if (out.empty())
    return std::to_string(offset_);
  if (offset_ != 0)
    out += (offset_ < 0 ? " - " : " + ") + std::to_string(offset_ < 0 ? -offset_ : offset_);
  return out;
}

std::string shapeStr(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      out += ", ";
    out += shape[i].str();
  }
  return out + "]";
}

Shape substituteShape(const Shape& shape, const SizeMap& sizes) {
  Shape out;
  for (const Dim& d : shape)
    out.push_back(d.substitute(sizes));
  return out;
}

} // namespace rnnc::ir
