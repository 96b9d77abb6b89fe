// What each libFuzzer harness feeds one input to, shared with the regression test that replays
// every input a run ever found (tests/test_fuzz_regressions.cpp), so a fixed crash stays fixed
// in the ordinary test binary too. Each parses the input as a user's file would be parsed: a
// UserError is the expected answer to bad input; anything else (a crash, another exception, a
// sanitizer report) is a finding.
#pragma once

#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "ir/IRParser.h"
#include "runtime/data/Npy.h"
#include "runtime/data/SafeTensors.h"
#include "runtime/data/TorchCheckpoint.h"

#include <string>
#include <string_view>

namespace rnnc::fuzz {

inline void cellParser(std::string_view data) {
  try {
    frontend::parseCell(std::string(data), "fuzz.cell");
  } catch (const UserError&) {
  }
}

inline void irParser(std::string_view data) {
  try {
    ir::parseIR(std::string(data), "fuzz.rnnir");
  } catch (const UserError&) {
  }
}

inline void safeTensors(std::string_view data) {
  try {
    parseSafeTensors(data, "fuzz.safetensors");
  } catch (const UserError&) {
  }
}

inline void torchCheckpoint(std::string_view data) {
  try {
    parseTorchCheckpoint(data, "fuzz.pt");
  } catch (const UserError&) {
  }
}

inline void npy(std::string_view data) {
  try {
    parseNpyFloat32(data, "fuzz.npy");
  } catch (const UserError&) {
  }
  try {
    parseNpyInt64(data, "fuzz.npy");
  } catch (const UserError&) {
  }
}

} // namespace rnnc::fuzz
