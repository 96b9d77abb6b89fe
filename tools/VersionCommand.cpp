#include "codegen/HostTarget.h"
#include "tools/Commands.h"

#include <iostream>

namespace rnnc::tools {

CommandAction addVersionCommand(CLI::App& app) {
  app.add_subcommand("version", "Print rnnc's version, its LLVM and the host target");
  return [] {
    codegen::HostTarget host = codegen::detectHostTarget();
    std::cout << "rnnc " << RNNC_VERSION << "\nLLVM " << codegen::llvmVersion() << "\ntarget "
              << host.triple << ", cpu " << host.cpu << "\nfeatures";
    for (const auto& feature : host.features)
      std::cout << " " << feature;
    std::cout << "\n";
    return 0;
  };
}

} // namespace rnnc::tools
