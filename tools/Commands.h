// The `rnnc` subcommands. Each registers its options on the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include "passes/PassManager.h"

#include <functional>
#include <string>
#include <vector>

namespace rnnc::tools {

using CommandAction = std::function<int()>;

CommandAction addRunCommand(CLI::App& app);
CommandAction addGradCommand(CLI::App& app);
CommandAction addDumpCommand(CLI::App& app);
CommandAction addBenchCommand(CLI::App& app);
CommandAction addCompileCommand(CLI::App& app);
CommandAction addVersionCommand(CLI::App& app);
CommandAction addCacheCommand(CLI::App& app);

// The optimisation pipeline's flags, shared by `compile` and `run`.
struct PipelineFlags {
  std::vector<std::string> printAfter, disabled, only;
  bool printAfterAll = false, noPremul = false, noFuse = false;

  void addTo(CLI::App& cmd);
  passes::PipelineOptions options() const;
};

} // namespace rnnc::tools
