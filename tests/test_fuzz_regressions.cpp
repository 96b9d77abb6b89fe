// Every input a libFuzzer run found (tests/fuzz/regressions/), and the cell parser's error cases,
// replayed through the harnesses' own functions: each must end in a result or a UserError.
#include "tests/fuzz/libfuzzer/Targets.h"

#include "ir/FileIO.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

namespace rnnc {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = RNNC_SOURCE_DIR;

int replay(const fs::path& dir, const std::function<void(std::string_view)>& target) {
  int replayed = 0;
  if (!fs::exists(dir))
    return 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file() || entry.path().extension() == ".md")
      continue;
    SCOPED_TRACE(entry.path().string());
    std::string bytes = readFileBytes(entry.path().string());
    EXPECT_NO_THROW(target(bytes));
    ++replayed;
  }
  return replayed;
}

TEST(FuzzRegressions, EveryFoundInputEndsInAResultOrAUserError) {
  const fs::path found = kSource / "tests" / "fuzz" / "regressions";
  EXPECT_GT(replay(found / "cell_parser", fuzz::cellParser) +
                replay(kSource / "tests" / "errors", fuzz::cellParser),
            0);
  EXPECT_GT(replay(found / "ir_parser", fuzz::irParser), 0);
  EXPECT_GT(replay(found / "safetensors", fuzz::safeTensors), 0);
  replay(found / "npy", fuzz::npy);
}

// The seed corpus parses as it should: the harnesses start from valid inputs.
TEST(FuzzRegressions, TheSeedIrDumpsAreValid) {
  int seeds = 0;
  for (const auto& entry : fs::directory_iterator(kSource / "tests" / "fuzz" / "corpus" / "ir")) {
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(ir::parseIR(readFileBytes(entry.path().string()), entry.path().string()));
    ++seeds;
  }
  EXPECT_GE(seeds, 3);
}

} // namespace
} // namespace rnnc
