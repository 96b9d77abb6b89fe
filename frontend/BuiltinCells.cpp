#include "frontend/BuiltinCells.h"

#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "ir/FileIO.h"
#include "ir/IRParser.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace rnnc::frontend {
namespace {

struct BuiltinCell {
  std::string_view name;
  std::string_view source;
};

constexpr BuiltinCell kBuiltinCells[] = {
#include "BuiltinCells.inc"
};

std::string readTextFile(const std::string& path) {
  return readFileBytes(path, "IR file");
}

} // namespace

std::vector<std::string> builtinCellNames() {
  std::vector<std::string> names;
  for (const auto& cell : kBuiltinCells)
    names.emplace_back(cell.name);
  return names;
}

std::optional<std::string_view> builtinCellSource(std::string_view name) {
  for (const auto& cell : kBuiltinCells)
    if (cell.name == name)
      return cell.source;
  return std::nullopt;
}

std::unique_ptr<ir::Cell> loadCell(const std::string& nameOrPath) {
  if (nameOrPath.ends_with(".rnnir"))
    return ir::parseIR(readTextFile(nameOrPath), nameOrPath);
  bool looksLikePath = nameOrPath.size() > 5 && nameOrPath.ends_with(".cell");
  std::error_code ec;
  if (looksLikePath || std::filesystem::is_regular_file(nameOrPath, ec))
    return parseCellFile(nameOrPath);
  if (auto source = builtinCellSource(nameOrPath))
    return parseCell(std::string(*source), "<builtin>/" + nameOrPath + ".cell");
  std::string known;
  for (const auto& name : builtinCellNames())
    known += (known.empty() ? "" : ", ") + name;
  throw UserError("unknown cell '" + nameOrPath + "': not a file, and not a built-in cell (" +
                  known + ")");
}

} // namespace rnnc::frontend
