// libFuzzer harness: rnnc::fuzz::torchCheckpoint (Targets.h). Run by tests/fuzz/run-libfuzzer.
#include "tests/fuzz/libfuzzer/Targets.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rnnc::fuzz::torchCheckpoint({reinterpret_cast<const char*>(data), size});
  return 0;
}
