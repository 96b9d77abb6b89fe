#include "runtime/exec/AmxPermission.h"

#include "ir/Error.h"

#include <cerrno>
#include <cstring>
#include <string>

#include <sys/syscall.h>
#include <unistd.h>

namespace rnnc {
namespace {

constexpr long kArchRequestPermission = 0x1023; // ARCH_REQ_XCOMP_PERM (asm/prctl.h)
constexpr long kTileData = 18;                  // XFEATURE_XTILEDATA

} // namespace

void requestAmxTiles() {
  static const std::string refusal = [] {
    if (syscall(SYS_arch_prctl, kArchRequestPermission, kTileData) == 0)
      return std::string();
    return std::string(std::strerror(errno));
  }();
  if (!refusal.empty())
    throw UserError(
        "this code multiplies on AMX tiles (bf16 or int8 weights on a CPU with AMX), whose "
        "state the OS did not grant this process (arch_prctl ARCH_REQ_XCOMP_PERM: " +
        refusal + "; Linux 5.16 or later grants it)");
}

} // namespace rnnc
