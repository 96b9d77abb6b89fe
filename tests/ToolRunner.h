// Runs the real `rnnc` binary from a test, as a user would from a shell, and captures its exit
// status, stdout and stderr.
//
//   ToolRunner tool(dir);                       // dir: a scratch directory owned by the test
//   ToolResult r = tool.run({"dump", "lstm"});
//   EXPECT_EQ(r.exitCode, 0) << r;
//
// Each argument is passed verbatim (single-quoted for the shell). The command runs with `dir` as
// its working directory and its stdout/stderr go to files there, which are read back.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include <sys/wait.h>

namespace rnnc::test {

struct ToolResult {
  // The exit status when the tool exited normally; 128 + N when it died from signal N (as a
  // shell reports it), -1 when it could not be run at all.
  int exitCode = -1;
  std::string out, err;
  std::string command; // what was run, for failure messages
};

inline std::ostream& operator<<(std::ostream& os, const ToolResult& r) {
  return os << "\n  command: " << r.command << "\n  exit code: " << r.exitCode
            << "\n  stdout: " << r.out << "\n  stderr: " << r.err;
}

class ToolRunner {
public:
  explicit ToolRunner(std::filesystem::path dir, std::string tool = RNNC_TOOL_PATH)
      : dir_(std::move(dir)), tool_(std::move(tool)) {}

  ToolResult run(const std::vector<std::string>& args) const { return run(args, ""); }

  // With `shellPrefix` run first in the same shell: limits (`ulimit -v 1000000; `) or
  // environment (`export RNNC_MAX_THREADS=9; `).
  ToolResult run(const std::vector<std::string>& args, const std::string& shellPrefix) const {
    const std::filesystem::path outFile = dir_ / "tool.stdout";
    const std::filesystem::path errFile = dir_ / "tool.stderr";
    ToolResult result;
    result.command = quote(tool_);
    for (const std::string& arg : args)
      result.command.append(" ").append(quote(arg)); // not `" " + ...`: GCC 12 -Wrestrict noise
    std::string shell = shellPrefix + "cd ";
    shell.append(quote(dir_.string()))
        .append(" && ")
        .append(result.command)
        .append(" >")
        .append(quote(outFile.string()))
        .append(" 2>")
        .append(quote(errFile.string()));
    const int status = std::system(shell.c_str());
    if (status != -1 && WIFEXITED(status))
      result.exitCode = WEXITSTATUS(status);
    else if (status != -1 && WIFSIGNALED(status))
      result.exitCode = 128 + WTERMSIG(status);
    result.out = readFile(outFile);
    result.err = readFile(errFile);
    return result;
  }

  ToolResult run(std::initializer_list<std::string> args) const {
    return run(std::vector<std::string>(args));
  }

  const std::filesystem::path& dir() const { return dir_; }

private:
  // POSIX shell single quoting: 'it'\''s'.
  static std::string quote(const std::string& text) {
    std::string out = "'";
    for (char c : text)
      out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }

  static std::string readFile(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::filesystem::path dir_;
  std::string tool_;
};

} // namespace rnnc::test
