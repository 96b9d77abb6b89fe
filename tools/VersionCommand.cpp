#include "codegen/HostTarget.h"
#include "runtime/exec/TargetMemo.h"
#include "tools/Commands.h"

#include <iostream>

namespace rnnc::tools {

CommandAction addVersionCommand(CLI::App& app) {
  app.add_subcommand("version", "Print rnnc's version, its LLVM and the host target");
  return [] {
    // The host as LLVM sees it, remembered in the compile cache (runtime/exec/TargetMemo.h):
    // with the cache warm, this loads neither the compiler library nor LLVM.
    const codegen::Target host = runnableTarget("", CacheOptions::fromEnvironment());
    std::cout << "rnnc " << RNNC_VERSION << "\nLLVM " << codegen::llvmVersion() << "\ntarget "
              << host.triple << ", cpu " << host.cpu << "\nfeatures";
    for (size_t at = 0; at < host.features.size();) {
      size_t end = host.features.find(',', at);
      if (end == std::string::npos)
        end = host.features.size();
      std::cout << " " << host.features.substr(at + 1, end - at - 1); // without its '+'
      at = end + 1;
    }
    std::cout << "\n";
    return 0;
  };
}

} // namespace rnnc::tools
