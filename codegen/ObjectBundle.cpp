#include "codegen/ObjectBundle.h"

#include "ir/Error.h"

#include <cstdint>

namespace rnnc::codegen {
namespace {

constexpr std::string_view kMagic = "RNNCOBJS";

void appendU64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out += static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t readU64(std::string_view bytes, size_t at) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i)
    value |= uint64_t(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return value;
}

} // namespace

bool isObjectBundle(std::string_view bytes) {
  return bytes.substr(0, kMagic.size()) == kMagic;
}

std::string bundleObjects(const std::vector<std::string>& objects) {
  std::string out(kMagic);
  appendU64(out, objects.size());
  for (const std::string& object : objects) {
    appendU64(out, object.size());
    out += object;
  }
  return out;
}

std::vector<std::string_view> objectsOfBundle(std::string_view bundle) {
  RNNC_INTERNAL_CHECK(isObjectBundle(bundle), "not an object bundle");
  size_t at = kMagic.size();
  auto need = [&](uint64_t bytes, const char* what) {
    if (bytes > bundle.size() - at)
      throw InternalError(std::string("damaged object bundle: ") + what + " past its end");
  };
  need(8, "the part count");
  const uint64_t count = readU64(bundle, at);
  at += 8;
  std::vector<std::string_view> objects;
  for (uint64_t i = 0; i < count; ++i) {
    need(8, "a part's size");
    const uint64_t size = readU64(bundle, at);
    at += 8;
    need(size, "a part");
    objects.push_back(bundle.substr(at, size));
    at += size;
  }
  if (at != bundle.size())
    throw InternalError("damaged object bundle: bytes after its last part");
  return objects;
}

} // namespace rnnc::codegen
