#include "ir/DimParser.h"

#include <cerrno>
#include <cstdlib>

namespace rnnc::ir {
namespace {

Dim parseAtom(Lexer& lexer, const SizeNameCheck& check) {
  const Token& token = lexer.peek();
  if (token.is("(")) {
    Lexer::Nesting nesting(lexer, token);
    lexer.next();
    Dim inner = parseDim(lexer, check);
    lexer.expect(")", "to close the parenthesised dimension");
    return inner;
  }
  if (token.kind == TokenKind::Number) {
    Token number = lexer.next();
    errno = 0;
    char* end = nullptr;
    long long value = std::strtoll(number.text.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE || value < 0)
      lexer.errorAt(number, "dimension '" + number.text + "' is not a non-negative integer");
    return Dim::constant(value);
  }
  if (token.kind == TokenKind::Identifier) {
    Token name = lexer.next();
    if (check)
      check(name);
    return Dim::symbol(name.text);
  }
  lexer.errorAt(token,
                "expected a dimension (a number or a size name), found " + Lexer::describe(token));
}

Dim parseTerm(Lexer& lexer, const SizeNameCheck& check) {
  Token first = lexer.peek();
  Dim product = parseAtom(lexer, check);
  while (lexer.peek().is("*")) {
    Token star = lexer.next();
    Dim factor = parseAtom(lexer, check);
    if (!product.isConstant() && !factor.isConstant())
      lexer.errorAt(star, "dimensions must be linear in the sizes: cannot multiply '" +
                              product.str() + "' by '" + factor.str() + "'");
    try {
      product = product.isConstant() ? factor * product.constantValue()
                                     : product * factor.constantValue();
    } catch (const UserError& e) {
      lexer.errorAt(star, e.what());
    }
  }
  return product;
}

} // namespace

Dim parseDim(Lexer& lexer, const SizeNameCheck& check) {
  Dim sum = parseTerm(lexer, check);
  while (lexer.peek().is("+") || lexer.peek().is("-")) {
    Token op = lexer.next();
    Dim term = parseTerm(lexer, check);
    try {
      sum = op.is("-") ? sum - term : sum + term;
    } catch (const UserError& e) {
      lexer.errorAt(op, e.what());
    }
  }
  return sum;
}

SizeList parseSizeList(Lexer& lexer, bool withValues) {
  SizeList sizes;
  lexer.expect("(", "to open the list of size names");
  if (!lexer.peek().is(")")) {
    do {
      Token size = lexer.expectIdentifier("a size name");
      if (size.text == kBatchSymbol)
        lexer.errorAt(size, "'B' is the batch size, always present; it cannot be declared");
      for (const auto& existing : sizes.names)
        if (existing == size.text)
          lexer.errorAt(size, "size '" + size.text + "' is declared twice");
      sizes.names.push_back(size.text);
      if (withValues && lexer.accept("=")) {
        Token value = lexer.expectNumber("the size's value");
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(value.text.c_str(), &end, 10);
        if (*end != '\0' || v <= 0 || errno == ERANGE)
          lexer.errorAt(value, "size value must be a positive integer");
        sizes.values.emplace_back(size.text, v);
      }
    } while (lexer.accept(","));
  }
  lexer.expect(")", "to close the list of size names");
  return sizes;
}

Shape parseShape(Lexer& lexer, const SizeNameCheck& check) {
  lexer.expect("[", "to open a shape");
  Shape shape;
  if (!lexer.peek().is("]")) {
    do {
      shape.push_back(parseDim(lexer, check));
    } while (lexer.accept(","));
  }
  lexer.expect("]", "to close the shape");
  return shape;
}

} // namespace rnnc::ir
