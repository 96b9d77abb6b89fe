#include "ir/Error.h"

#include <algorithm>

namespace rnnc {

std::string formatAt(const SourceLoc& loc, const std::string& message) {
  std::string out;
  if (!loc.file.empty())
    out += loc.file + ":";
  if (loc.line > 0)
    out += std::to_string(loc.line) + ":" + std::to_string(loc.col) + ":";
  if (!out.empty())
    out += " ";
  out += "error: " + message;
  if (loc.line > 0 && !loc.lineText.empty()) {
    out += "\n  " + loc.lineText + "\n  ";
    // Keep tabs in the caret line so the caret lines up under tab-indented source.
    int col = std::max(loc.col, 1);
    for (int i = 0; i + 1 < col && i < static_cast<int>(loc.lineText.size()); ++i)
      out += loc.lineText[i] == '\t' ? '\t' : ' ';
    out += '^';
    for (int i = 1; i < loc.length; ++i)
      out += '~';
  }
  return out;
}

void throwUserErrorAt(const SourceLoc& loc, const std::string& message) {
  throw UserError(formatAt(loc, message));
}

} // namespace rnnc
