#include "frontend/BuiltinCells.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "tools/CommandLine.h"
#include "tools/Commands.h"

#include <iostream>
#include <memory>

namespace rnnc::tools {
namespace {

struct DumpOptions {
  std::string cell;
  std::vector<std::string> sizes;
};

} // namespace

CommandAction addDumpCommand(CLI::App& app) {
  auto options = std::make_shared<DumpOptions>();
  CLI::App* cmd = app.add_subcommand("dump", "Print a cell's IR");
  cmd->add_option("cell", options->cell, "Built-in cell name, .cell file or .rnnir IR dump")
      ->required();
  cmd->add_option("--size", options->sizes, "Bind a named size: NAME=VALUE (repeatable)");
  return [options] {
    auto cell = frontend::loadCell(options->cell);
    ir::SizeMap sizes = parseSizes(options->sizes);
    if (!sizes.empty()) {
      cell->bindSizes(sizes);
      ir::verify(*cell);
    }
    std::cout << *cell;
    return 0;
  };
}

} // namespace rnnc::tools
