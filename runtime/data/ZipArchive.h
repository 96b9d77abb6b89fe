// The entries of a zip archive held in memory, as PyTorch's torch.save writes them: stored, not
// compressed (its archives are zips of a pickle and the tensors' raw storages). The archive comes
// from outside, so every offset and size is checked against the bytes before any entry is read:
// a truncated or malformed archive is a UserError naming the file, never a read past its end.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>

namespace rnnc {

struct ZipEntries {
  std::map<std::string, std::string_view> stored; // each stored entry's bytes, by name
  std::set<std::string> compressed;               // the names of the others (not read here)
};

// The archive's entries (views into `archive`, which must outlive them). An encrypted entry, an
// entry named twice and a central directory or entry that does not fit the archive are errors
// naming `path`; ZIP64 sizes and offsets are read.
ZipEntries readZipEntries(std::string_view archive, const std::string& path);

// Whether the bytes start as a zip archive does (a local file header).
bool looksLikeZip(std::string_view bytes);

} // namespace rnnc
