// rnnc: compile and run recurrent cells. See README.md for the commands.
#include "ir/Error.h"
#include "ir/HugePages.h"
#include "tools/Commands.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <malloc.h>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

// The first 64 MB of the heap on 2 MB pages where the kernel gives them (transparent huge pages
// on advice): every fresh 4 KB page costs a fault on first touch, microseconds apiece in a VM
// (7 us on a Zen 5 VM, about a CPUID's exit), and a run's weights, their packed copies and its
// workspace are megabytes: a warm `rnnc run` of a batch-1 LSTM (2 MB of weights) spent more time
// faulting than running (18.9 -> 14.7 ms; the interpreter 21.8 -> 15.2). A block malloc'd and freed
// stays in the heap (the thresholds main sets), so the tensors that follow are carved from the
// advised pages. Only whole 2 MB pages can be huge, and the heap starts anywhere: the part below
// its first 2 MB boundary is taken by a block kept for good (never touched past its header), or
// the first tensors land there on 4 KB pages (the weights of that LSTM, read into 1 MB tensors,
// took 0.34 ms each to fault in there, 0.13 above the boundary).
void* volatile heapBelowFirstHugePage = nullptr; // volatile: an unused malloc may be elided

void reserveHeapOnHugePages() {
  constexpr size_t kReserve = size_t{64} << 20;
  void* block = std::malloc(kReserve + rnnc::kHugePageBytes);
  if (!block)
    return;
  const auto start = reinterpret_cast<std::uintptr_t>(block);
  const std::uintptr_t boundary =
      (start + rnnc::kHugePageBytes - 1) / rnnc::kHugePageBytes * rnnc::kHugePageBytes;
  rnnc::adviseHugePages(block, kReserve + rnnc::kHugePageBytes);
  std::free(block);
  // The next block starts where the freed one did; its size and glibc's chunk header (two
  // words) end it just below the boundary.
  constexpr size_t kChunkHeader = 2 * sizeof(size_t);
  if (boundary - start > 2 * kChunkHeader)
    heapBelowFirstHugePage = std::malloc(boundary - start - 2 * kChunkHeader);
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
  using AddCommand = rnnc::tools::CommandAction (*)(CLI::App&);
  // In the order `rnnc --help` lists them.
  const std::vector<std::pair<std::string, AddCommand>> commands = {
      {"run", rnnc::tools::addRunCommand},     {"grad", rnnc::tools::addGradCommand},
      {"dump", rnnc::tools::addDumpCommand},   {"compile", rnnc::tools::addCompileCommand},
      {"bench", rnnc::tools::addBenchCommand}, {"version", rnnc::tools::addVersionCommand},
      {"cache", rnnc::tools::addCacheCommand},
  };
  // CLI11 would only say "A subcommand is required" for a mistyped command.
  auto isCommand = [&](const std::string& word) {
    return std::any_of(commands.begin(), commands.end(),
                       [&](const auto& entry) { return entry.first == word; });
  };
  if (argc > 1 && argv[1][0] != '-' && !isCommand(argv[1])) {
    std::cerr << "rnnc: unknown command '" << argv[1] << "' (commands:";
    for (const auto& entry : commands)
      std::cerr << " " << entry.first;
    std::cerr << "); see rnnc --help\n";
    return 2;
  }
  // Only the named command's options are built (with all of them, `rnnc version` spent longer
  // building and destroying the parser than doing its work); `rnnc --help` and anything that
  // does not start with a command get every command.
  std::map<std::string, rnnc::tools::CommandAction> actions;
  for (const auto& [name, add] : commands)
    if (argc < 2 || name == argv[1] || !isCommand(argv[1]))
      actions[name] = add(app);
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
