// Parses dimension expressions and shapes, shared by the cell language and the IR parser:
//   dim   := term (('+' | '-') term)*
//   term  := atom ('*' atom)*          (at most one atom may mention a size: dims stay linear)
//   atom  := INTEGER | IDENTIFIER | '(' dim ')'
//   shape := '[' [dim (',' dim)*] ']'
// and a cell's header list of size names:
//   sizes := '(' [IDENTIFIER ['=' INTEGER] (',' IDENTIFIER ['=' INTEGER])*] ')'
#pragma once

#include "ir/Dim.h"
#include "ir/Lexer.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace rnnc::ir {

// Called for each size name met, so the caller can reject unknown names at their position.
using SizeNameCheck = std::function<void(const Token&)>;

Dim parseDim(Lexer& lexer, const SizeNameCheck& check);
Shape parseShape(Lexer& lexer, const SizeNameCheck& check);

// The size names a cell declares, in order, and the values given to any (`name = 4`, which only
// the IR allows: `withValues`); an error at the name for 'B' (always present) and for a name
// given twice.
struct SizeList {
  std::vector<std::string> names;
  std::vector<std::pair<std::string, int64_t>> values;
};
SizeList parseSizeList(Lexer& lexer, bool withValues);

} // namespace rnnc::ir
