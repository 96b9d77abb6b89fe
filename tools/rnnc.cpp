// rnnc: compile and run recurrent cells. See README.md for the commands.
#include "ir/Error.h"
#include "ir/HugePages.h"
#include "tools/Commands.h"

#include <cstdlib>
#include <iostream>
#include <malloc.h>
#include <map>
#include <string>

namespace {

// The first 64 MB of the heap on 2 MB pages where the kernel gives them (transparent huge pages
// on advice): every fresh 4 KB page costs a fault on first touch, microseconds apiece in a VM
// (7 us on a Zen 5 VM, about a CPUID's exit), and a run's weights, their packed copies and its
// workspace are megabytes: a warm `rnnc run` of a batch-1 LSTM (2 MB of weights) spent more time
// faulting than running (18.9 -> 14.7 ms; the interpreter 21.8 -> 15.2). A block malloc'd and freed
// stays in the heap (the thresholds main sets), so the tensors that follow are carved from the
// advised pages.
void reserveHeapOnHugePages() {
  constexpr size_t kReserve = size_t{64} << 20;
  void* block = std::malloc(kReserve);
  if (!block)
    return;
  rnnc::adviseHugePages(block, kReserve);
  std::free(block);
}

} // namespace

int main(int argc, char** argv) {
  // glibc returns freed blocks over 128 KB to the OS, so every [B, H] tensor would page-fault
  // in fresh zeroed memory: keep them in the heap, as PyTorch's caching allocator does, so that
  // timings measure computation.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Not for the commands that touch little memory (version, cache, dump, --help): a first huge
  // page costs them its zeroing, half a millisecond in a VM.
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "run" || command == "grad" || command == "bench")
    reserveHeapOnHugePages();
  CLI::App app{"rnnc: a JIT compiler for recurrent neural network cells"};
  app.require_subcommand(1);
  std::map<std::string, rnnc::tools::CommandAction> actions = {
      {"run", rnnc::tools::addRunCommand(app)},
      {"grad", rnnc::tools::addGradCommand(app)},
      {"dump", rnnc::tools::addDumpCommand(app)},
      {"compile", rnnc::tools::addCompileCommand(app)},
      {"bench", rnnc::tools::addBenchCommand(app)},
      {"version", rnnc::tools::addVersionCommand(app)},
      {"cache", rnnc::tools::addCacheCommand(app)},
  };
  // CLI11 would only say "A subcommand is required" for a mistyped command.
  if (argc > 1 && argv[1][0] != '-' && !actions.count(argv[1])) {
    std::cerr << "rnnc: unknown command '" << argv[1] << "' (commands:";
    for (const auto& entry : actions)
      std::cerr << " " << entry.first;
    std::cerr << "); see rnnc --help\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is a ParseError too (exit 0); every real usage error exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (auto* sub : app.get_subcommands())
      return actions.at(sub->get_name())();
  } catch (const rnnc::UserError& e) {
    std::string message = e.what();
    // Located errors already read `file:line:col: error: ...`.
    bool located = message.substr(0, message.find('\n')).find(": error: ") != std::string::npos ||
                   message.rfind("error: ", 0) == 0;
    std::cerr << (located ? "" : "rnnc: error: ") << message << "\n";
    return 1;
  } catch (const rnnc::InternalError& e) {
    std::cerr << "rnnc: " << e.what() << "\nThis is a bug in rnnc; please report it.\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "rnnc: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
