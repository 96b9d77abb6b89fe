// Whole-file reads and writes with errors that name the file, for the tensor file formats.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rnnc {

// The file's bytes; throws UserError "PATH: cannot open file: REASON" (or read).
std::string readFileBytes(const std::string& path);

// Writes the chunks one after another, replacing any existing file; throws UserError on failure,
// including a full disk reported only when the file is closed.
void writeFileBytes(const std::string& path, const std::vector<std::string_view>& chunks);

} // namespace rnnc
