// rnnc: compile and run recurrent cells. See README.md for the commands.
#include "ir/Error.h"
#include "tools/Commands.h"

#include <iostream>
#include <map>

int main(int argc, char** argv) {
  CLI::App app{"rnnc: a JIT compiler for recurrent neural network cells"};
  app.require_subcommand(1);
  std::map<std::string, rnnc::tools::CommandAction> actions = {
      {"run", rnnc::tools::addRunCommand(app)},
      {"dump", rnnc::tools::addDumpCommand(app)},
      {"compile", rnnc::tools::addCompileCommand(app)},
      {"bench", rnnc::tools::addBenchCommand(app)},
      {"version", rnnc::tools::addVersionCommand(app)},
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
