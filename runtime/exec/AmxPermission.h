// Linux gives a process AMX's tile state (8 KB a thread, saved at each switch) only when it asks
// (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16 and later); without it the first tile
// instruction of generated code is SIGILL. Compiled code that uses AMX tiles
// (codegen::PackedProduct::amxTiles) asks before it first runs.
#pragma once

namespace rnnc {

// Asks once per process; UserError, saying why, where the OS refuses.
void requestAmxTiles();

} // namespace rnnc
