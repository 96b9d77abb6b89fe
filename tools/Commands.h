// The `rnnc` subcommands. Each registers its options on the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace rnnc::tools {

using CommandAction = std::function<int()>;

CommandAction addRunCommand(CLI::App& app);
CommandAction addDumpCommand(CLI::App& app);
CommandAction addBenchCommand(CLI::App& app);
CommandAction addCompileCommand(CLI::App& app);
CommandAction addVersionCommand(CLI::App& app);

// The optimisation pipeline's options, shared by `compile`, `run` and `bench`.
void addPipelineOptions(CLI::App& cmd, std::vector<std::string>& printAfter,
                        std::vector<std::string>& disabled, bool& printAfterAll, bool& noPremul,
                        bool& noFuse);

} // namespace rnnc::tools
