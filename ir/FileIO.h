// Whole-file reads and writes with errors that name the file, for every reader: cells, IR dumps,
// tensor files, cache entries.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rnnc {

// The file's bytes; throws UserError "PATH: cannot open file: REASON" (or read). Only regular
// files and pipes are read (a device such as /dev/zero never ends), and at most
// maxFileBytes(): a longer file, or one memory cannot hold, is an error naming the file.
// `kind` names the file in messages ("cell file": "PATH: cannot open cell file: REASON").
std::string readFileBytes(const std::string& path, const std::string& kind = "file");

// 64 GiB, or the environment variable RNNC_MAX_FILE_BYTES.
int64_t maxFileBytes();

// Writes the chunks one after another, replacing any existing file; throws UserError on failure,
// including a full disk reported only when the file is closed.
void writeFileBytes(const std::string& path, const std::vector<std::string_view>& chunks);

} // namespace rnnc
