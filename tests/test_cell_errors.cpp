// Error messages of the cell language, one bad file per kind of error in tests/errors/.
//
// Each file states what the parser must say in header comments:
//
//   # expect: {file}:8:24: error: cannot add [B, 4*hidden_size] and [B, hidden_size]
//
// Every `# expect:` line's text must appear in the UserError's message, with `{file}` replaced by
// the path given to the parser. The message must also show the source line with a caret under
// the column it names.
// To add a case, drop a new .cell file in tests/errors/ and run
// `build/tools/rnnc dump tests/errors/<name>.cell` to see what it reports.
#include "frontend/CellParser.h"
#include "ir/Error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace rnnc {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const fs::path kErrorsDir = fs::path(RNNC_SOURCE_DIR) / "tests" / "errors";

std::vector<std::string> errorCases() {
  std::vector<std::string> cases;
  for (const auto& entry : fs::directory_iterator(kErrorsDir))
    if (entry.is_regular_file() && entry.path().extension() == ".cell")
      cases.push_back(entry.path().stem().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

struct Header {
  std::vector<std::string> expected; // the `# expect: <text>` lines, {file} replaced
};

// Reads the directives in the file's leading comment block.
Header readHeader(const std::string& path) {
  std::ifstream in(path);
  Header header;
  const std::string expect = "# expect: ";
  for (std::string line; std::getline(in, line) && line.rfind("#", 0) == 0;) {
    if (line.rfind(expect, 0) != 0)
      continue;
    std::string text = line.substr(expect.size());
    while (!text.empty() && (text.back() == ' ' || text.back() == '\r'))
      text.pop_back();
    for (size_t at; (at = text.find("{file}")) != std::string::npos;)
      text.replace(at, 6, path);
    header.expected.push_back(text);
  }
  return header;
}

class CellErrorFile : public ::testing::TestWithParam<std::string> {};

TEST_P(CellErrorFile, ReportsTheExpectedError) {
  const std::string path = (kErrorsDir / (GetParam() + ".cell")).string();
  const Header header = readHeader(path);
  ASSERT_FALSE(header.expected.empty()) << path << " has no '# expect: <text>' line in its header";

  std::string message;
  try {
    frontend::parseCellFile(path);
    FAIL() << path << " parsed without error";
  } catch (const UserError& e) {
    message = e.what();
  }
  for (const std::string& text : header.expected)
    EXPECT_THAT(message, HasSubstr(text));

  // `file:line:col: error: ...`, then the source line, then a caret under `col`.
  EXPECT_THAT(message, StartsWith(path + ":"));
  int line = 0, col = 0;
  ASSERT_EQ(std::sscanf(message.c_str() + path.size(), ":%d:%d: error: ", &line, &col), 2)
      << message;
  std::vector<std::string> lines = splitLines(message);
  ASSERT_EQ(lines.size(), 3u) << message;
  std::vector<std::string> source =
      splitLines(std::string(std::istreambuf_iterator<char>(std::ifstream(path).rdbuf()), {}));
  ASSERT_GE(line, 1) << message;
  ASSERT_LE(line, static_cast<int>(source.size())) << message;
  EXPECT_EQ(lines[1], "  " + source[line - 1]) << message;
  const std::string& caretLine = lines[2];
  size_t caret = caretLine.find('^');
  ASSERT_NE(caret, std::string::npos) << "no caret line:\n" << message;
  EXPECT_EQ(caretLine.find_first_not_of(" \t"), caret) << message;
  EXPECT_EQ(static_cast<int>(caret), 2 + col - 1)
      << "the caret is not under column " << col << ":\n"
      << message;
}

INSTANTIATE_TEST_SUITE_P(Files, CellErrorFile, ::testing::ValuesIn(errorCases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(CellErrorFiles, TheFolderHasACaseForEachKindOfError) {
  EXPECT_GE(errorCases().size(), 32u);
}

TEST(CellErrorFiles, AMissingFileIsAUserError) {
  const std::string path = (kErrorsDir / "does_not_exist.cell").string();
  try {
    frontend::parseCellFile(path);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), StartsWith(path + ": cannot open cell file"));
  }
}

} // namespace
} // namespace rnnc
