// The zip format (PKWARE's APPNOTE.TXT): local file headers each followed by an entry's data,
// then the central directory (one record per entry, with where its local header is), then the
// end of central directory record; ZIP64 moves sizes and offsets of 4 GB and more into extra
// fields and a ZIP64 end record found through a locator just before the classic one.
#include "runtime/data/ZipArchive.h"

#include "ir/Error.h"

#include <algorithm>
#include <cstring>
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

// A little-endian field of `width` bytes at `at` in `b` (which holds it).
uint64_t le(std::string_view b, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i)
    value = value << 8 | static_cast<unsigned char>(b[at + static_cast<size_t>(i)]);
  return value;
}
uint16_t u16(std::string_view b, size_t at) {
  return static_cast<uint16_t>(le(b, at, 2));
}
uint32_t u32(std::string_view b, size_t at) {
  return static_cast<uint32_t>(le(b, at, 4));
}
uint64_t u64(std::string_view b, size_t at) {
  return le(b, at, 8);
}

// The archive's pieces, each checked against its length before it is read.
class Archive {
public:
  Archive(const ByteSource& source, const std::string& path) : source_(source), path_(path) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw UserError(
        fmt::format("{}: not a valid zip archive (torch.save's format): {}", path_, message));
  }
  void need(uint64_t offset, uint64_t count, const std::string& what) const {
    if (offset > source_.size() || count > source_.size() - offset)
      fail(fmt::format("{} at byte {} runs past the end of the file ({} bytes)", what, offset,
                       source_.size()));
  }
  std::string piece(uint64_t offset, uint64_t count, const std::string& what) const {
    need(offset, count, what);
    return source_.readString(offset, static_cast<size_t>(count));
  }
  uint64_t size() const { return source_.size(); }

private:
  const ByteSource& source_;
  const std::string& path_;
};

struct Directory {
  uint64_t offset = 0, bytes = 0, entries = 0;
};

// The end of central directory record, in the file's last 64 KB: the last one whose comment
// reaches the end of the file.
Directory readDirectory(const Archive& a) {
  if (a.size() < kEndRecordBytes)
    a.fail("no end of central directory record");
  const uint64_t tailStart =
      a.size() - std::min<uint64_t>(a.size(), kEndRecordBytes + kMaxCommentBytes);
  const std::string tail = a.piece(tailStart, a.size() - tailStart, "the end of the file");
  std::optional<size_t> end;
  for (size_t at = tail.size() - kEndRecordBytes + 1; at-- > 0;)
    if (u32(tail, at) == kEndRecord && at + kEndRecordBytes + u16(tail, at + 20) == tail.size()) {
      end = at;
      break;
    }
  if (!end)
    a.fail("no end of central directory record");
  Directory d{u32(tail, *end + 16), u32(tail, *end + 12), u16(tail, *end + 10)};
  if (u16(tail, *end + 4) != 0 || u16(tail, *end + 6) != 0)
    a.fail("a multi-disk archive");
  const bool zip64 = d.offset == 0xffffffffu || d.bytes == 0xffffffffu || d.entries == 0xffffu;
  if (zip64) {
    const uint64_t endRecord = tailStart + *end;
    if (endRecord < kZip64LocatorBytes)
      a.fail("ZIP64 sizes without a ZIP64 end of central directory locator");
    const std::string locator =
        a.piece(endRecord - kZip64LocatorBytes, kZip64LocatorBytes, "the ZIP64 locator");
    if (u32(locator, 0) != kZip64Locator)
      a.fail("ZIP64 sizes without a ZIP64 end of central directory locator");
    const std::string record =
        a.piece(u64(locator, 8), kZip64EndRecordBytes, "the ZIP64 end of central directory record");
    if (u32(record, 0) != kZip64EndRecord)
      a.fail("the ZIP64 locator does not point at a ZIP64 end of central directory record");
    d = Directory{u64(record, 48), u64(record, 40), u64(record, 32)};
  }
  a.need(d.offset, d.bytes, "the central directory");
  return d;
}

// A central directory record's sizes and local header offset, from its ZIP64 extra field where
// the 32-bit ones say so (each present only where its 32-bit field is all ones, in this order).
struct Sizes {
  uint64_t compressed, uncompressed, localHeader;
};

Sizes zip64Sizes(const Archive& a, std::string_view extra, Sizes sizes, const std::string& name) {
  uint64_t* fields[] = {&sizes.uncompressed, &sizes.compressed, &sizes.localHeader};
  const bool wanted[] = {sizes.uncompressed == 0xffffffffu, sizes.compressed == 0xffffffffu,
                         sizes.localHeader == 0xffffffffu};
  if (!wanted[0] && !wanted[1] && !wanted[2])
    return sizes;
  for (size_t at = 0; at + 4 <= extra.size();) {
    const uint16_t id = u16(extra, at), bytes = u16(extra, at + 2);
    if (at + 4 + bytes > extra.size())
      break;
    if (id == kZip64ExtraId) {
      size_t field = at + 4;
      for (int i = 0; i < 3; ++i)
        if (wanted[i]) {
          if (field + 8 > at + 4 + bytes)
            a.fail(fmt::format("entry '{}': its ZIP64 extra field is too short", name));
          *fields[i] = u64(extra, field);
          field += 8;
        }
      return sizes;
    }
    at += 4 + bytes;
  }
  a.fail(fmt::format("entry '{}': ZIP64 sizes without a ZIP64 extra field", name));
}

} // namespace

std::string ByteSource::readString(uint64_t offset, size_t count) const {
  std::string bytes(count, '\0');
  if (count > 0)
    read(offset, count, bytes.data());
  return bytes;
}

void MemorySource::read(uint64_t offset, size_t count, char* into) const {
  std::memcpy(into, bytes_.data() + offset, count);
}

bool looksLikeZip(std::string_view bytes) {
  return bytes.size() >= 4 && bytes.substr(0, 4) == std::string_view("PK\x03\x04", 4);
}

ZipEntries readZipEntries(const ByteSource& source, const std::string& path) {
  const Archive a(source, path);
  const Directory d = readDirectory(a);
  const std::string directory = a.piece(d.offset, d.bytes, "the central directory");
  ZipEntries entries;
  size_t at = 0;
  for (uint64_t i = 0; i < d.entries; ++i) {
    if (at + kCentralHeaderBytes > directory.size())
      a.fail(fmt::format("the central directory ends after {} of its {} entries", i, d.entries));
    if (u32(directory, at) != kCentralHeader)
      a.fail(fmt::format("central directory record {} has no signature", i));
    const uint16_t flags = u16(directory, at + 8), method = u16(directory, at + 10);
    const uint16_t nameBytes = u16(directory, at + 28), extraBytes = u16(directory, at + 30);
    const uint16_t commentBytes = u16(directory, at + 32);
    const size_t recordBytes = kCentralHeaderBytes + nameBytes + extraBytes + commentBytes;
    if (at + recordBytes > directory.size())
      a.fail(fmt::format("central directory record {} runs past the directory", i));
    const std::string_view record = std::string_view(directory).substr(at, recordBytes);
    std::string name(record.substr(kCentralHeaderBytes, nameBytes));
    const Sizes sizes = zip64Sizes(a, record.substr(kCentralHeaderBytes + nameBytes, extraBytes),
                                   Sizes{u32(record, 20), u32(record, 24), u32(record, 42)}, name);
    if (flags & 1u)
      a.fail(fmt::format("entry '{}' is encrypted", name));
    const bool stored = method == 0 && sizes.compressed == sizes.uncompressed;
    const std::string local = a.piece(sizes.localHeader, kLocalHeaderBytes,
                                      fmt::format("entry '{}': its local header", name));
    if (u32(local, 0) != kLocalHeader)
      a.fail(fmt::format("entry '{}': no local header at byte {}", name, sizes.localHeader));
    const uint64_t data = sizes.localHeader + kLocalHeaderBytes + u16(local, 26) + u16(local, 28);
    a.need(data, sizes.compressed, fmt::format("entry '{}': its data", name));
    if (entries.stored.count(name) || entries.compressed.count(name))
      a.fail(fmt::format("entry '{}' is named twice", name));
    if (stored)
      entries.stored.emplace(name, ZipEntry{data, sizes.compressed});
    else
      entries.compressed.insert(name);
    at += recordBytes;
  }
  return entries;
}

} // namespace rnnc
