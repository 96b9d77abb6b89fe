// Parses dimension expressions and shapes, shared by the cell language and the IR parser:
//   dim   := term (('+' | '-') term)*
//   term  := atom ('*' atom)*          (at most one atom may mention a size: dims stay linear)
//   atom  := INTEGER | IDENTIFIER | '(' dim ')'
//   shape := '[' [dim (',' dim)*] ']'
#pragma once

#include "ir/Dim.h"
#include "ir/Lexer.h"

#include <functional>

namespace rnnc::ir {

// Called for each size name met, so the caller can reject unknown names at their position.
using SizeNameCheck = std::function<void(const Token&)>;

Dim parseDim(Lexer& lexer, const SizeNameCheck& check);
Shape parseShape(Lexer& lexer, const SizeNameCheck& check);

} // namespace rnnc::ir
