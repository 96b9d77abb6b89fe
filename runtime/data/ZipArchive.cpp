// The zip format (PKWARE's APPNOTE.TXT): local file headers each followed by an entry's data,
// then the central directory (one record per entry, with where its local header is), then the
// end of central directory record; ZIP64 moves sizes and offsets of 4 GB and more into extra
// fields and a ZIP64 end record found through a locator just before the classic one.
#include "runtime/data/ZipArchive.h"

#include "ir/Error.h"

#include <cstdint>
#include <optional>

#include <fmt/format.h>

namespace rnnc {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndRecord = 0x06054b50;
constexpr uint32_t kZip64EndRecord = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr size_t kEndRecordBytes = 22, kCentralHeaderBytes = 46, kLocalHeaderBytes = 30;
constexpr size_t kZip64LocatorBytes = 20, kZip64EndRecordBytes = 56;
constexpr size_t kMaxCommentBytes = 0xffff;

// Little-endian fields at checked offsets of the archive.
class Reader {
public:
  Reader(std::string_view bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw UserError(
        fmt::format("{}: not a valid zip archive (torch.save's format): {}", path_, message));
  }
  void need(uint64_t offset, uint64_t count, const char* what) const {
    if (offset > bytes_.size() || count > bytes_.size() - offset)
      fail(fmt::format("{} at byte {} runs past the end of the file ({} bytes)", what, offset,
                       bytes_.size()));
  }
  uint64_t le(uint64_t offset, int width) const {
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i)
      value = value << 8 | static_cast<unsigned char>(bytes_[offset + i]);
    return value;
  }
  uint16_t u16(uint64_t offset) const { return static_cast<uint16_t>(le(offset, 2)); }
  uint32_t u32(uint64_t offset) const { return static_cast<uint32_t>(le(offset, 4)); }
  uint64_t u64(uint64_t offset) const { return le(offset, 8); }
  std::string_view slice(uint64_t offset, uint64_t count) const {
    return bytes_.substr(offset, count);
  }
  uint64_t size() const { return bytes_.size(); }

private:
  std::string_view bytes_;
  const std::string& path_;
};

struct Directory {
  uint64_t offset = 0, bytes = 0, entries = 0;
};

// The end of central directory record: the last one whose comment reaches the end of the file.
std::optional<uint64_t> findEndRecord(const Reader& r) {
  if (r.size() < kEndRecordBytes)
    return std::nullopt;
  const uint64_t last = r.size() - kEndRecordBytes;
  const uint64_t first = last > kMaxCommentBytes ? last - kMaxCommentBytes : 0;
  for (uint64_t at = last + 1; at-- > first;)
    if (r.u32(at) == kEndRecord && at + kEndRecordBytes + r.u16(at + 20) == r.size())
      return at;
  return std::nullopt;
}

Directory readDirectory(const Reader& r) {
  std::optional<uint64_t> end = findEndRecord(r);
  if (!end)
    r.fail("no end of central directory record");
  Directory d{r.u32(*end + 16), r.u32(*end + 12), r.u16(*end + 10)};
  if (r.u16(*end + 4) != 0 || r.u16(*end + 6) != 0)
    r.fail("a multi-disk archive");
  const bool zip64 = d.offset == 0xffffffffu || d.bytes == 0xffffffffu || d.entries == 0xffffu;
  if (zip64) {
    if (*end < kZip64LocatorBytes || r.u32(*end - kZip64LocatorBytes) != kZip64Locator)
      r.fail("ZIP64 sizes without a ZIP64 end of central directory locator");
    const uint64_t record = r.u64(*end - kZip64LocatorBytes + 8);
    r.need(record, kZip64EndRecordBytes, "the ZIP64 end of central directory record");
    if (r.u32(record) != kZip64EndRecord)
      r.fail("the ZIP64 locator does not point at a ZIP64 end of central directory record");
    d = Directory{r.u64(record + 48), r.u64(record + 40), r.u64(record + 32)};
  }
  r.need(d.offset, d.bytes, "the central directory");
  return d;
}

// A central directory record's sizes and local header offset, from its ZIP64 extra field where
// the 32-bit ones say so (each present only where its 32-bit field is all ones, in this order).
struct Sizes {
  uint64_t compressed, uncompressed, localHeader;
};

Sizes zip64Sizes(const Reader& r, uint64_t extra, uint64_t extraBytes, Sizes sizes,
                 const std::string& name) {
  uint64_t* fields[] = {&sizes.uncompressed, &sizes.compressed, &sizes.localHeader};
  const bool wanted[] = {sizes.uncompressed == 0xffffffffu, sizes.compressed == 0xffffffffu,
                         sizes.localHeader == 0xffffffffu};
  if (!wanted[0] && !wanted[1] && !wanted[2])
    return sizes;
  for (uint64_t at = extra; at + 4 <= extra + extraBytes;) {
    const uint16_t id = r.u16(at), bytes = r.u16(at + 2);
    if (at + 4 + bytes > extra + extraBytes)
      break;
    if (id == kZip64ExtraId) {
      uint64_t field = at + 4;
      for (int i = 0; i < 3; ++i)
        if (wanted[i]) {
          if (field + 8 > at + 4 + bytes)
            r.fail(fmt::format("entry '{}': its ZIP64 extra field is too short", name));
          *fields[i] = r.u64(field);
          field += 8;
        }
      return sizes;
    }
    at += 4 + bytes;
  }
  r.fail(fmt::format("entry '{}': ZIP64 sizes without a ZIP64 extra field", name));
}

} // namespace

bool looksLikeZip(std::string_view bytes) {
  return bytes.size() >= 4 && bytes.substr(0, 4) == std::string_view("PK\x03\x04", 4);
}

ZipEntries readZipEntries(std::string_view archive, const std::string& path) {
  const Reader r(archive, path);
  const Directory d = readDirectory(r);
  ZipEntries entries;
  uint64_t at = d.offset;
  for (uint64_t i = 0; i < d.entries; ++i) {
    if (at < d.offset || at - d.offset + kCentralHeaderBytes > d.bytes)
      r.fail(fmt::format("the central directory ends after {} of its {} entries", i, d.entries));
    if (r.u32(at) != kCentralHeader)
      r.fail(fmt::format("central directory record {} has no signature", i));
    const uint16_t flags = r.u16(at + 8), method = r.u16(at + 10);
    const uint16_t nameBytes = r.u16(at + 28), extraBytes = r.u16(at + 30);
    const uint16_t commentBytes = r.u16(at + 32);
    const uint64_t recordBytes = kCentralHeaderBytes + nameBytes + extraBytes + commentBytes;
    if (at - d.offset + recordBytes > d.bytes)
      r.fail(fmt::format("central directory record {} runs past the directory", i));
    std::string name(r.slice(at + kCentralHeaderBytes, nameBytes));
    const Sizes sizes = zip64Sizes(r, at + kCentralHeaderBytes + nameBytes, extraBytes,
                                   Sizes{r.u32(at + 20), r.u32(at + 24), r.u32(at + 42)}, name);
    if (flags & 1u)
      r.fail(fmt::format("entry '{}' is encrypted", name));
    const bool stored = method == 0 && sizes.compressed == sizes.uncompressed;
    const uint64_t local = sizes.localHeader;
    r.need(local, kLocalHeaderBytes, fmt::format("entry '{}': its local header", name).c_str());
    if (r.u32(local) != kLocalHeader)
      r.fail(fmt::format("entry '{}': no local header at byte {}", name, local));
    const uint64_t data = local + kLocalHeaderBytes + r.u16(local + 26) + r.u16(local + 28);
    r.need(data, sizes.compressed, fmt::format("entry '{}': its data", name).c_str());
    if (entries.stored.count(name) || entries.compressed.count(name))
      r.fail(fmt::format("entry '{}' is named twice", name));
    if (stored)
      entries.stored.emplace(name, r.slice(data, sizes.compressed));
    else
      entries.compressed.insert(name);
    at += recordBytes;
  }
  return entries;
}

} // namespace rnnc
