// The tokenizer shared by the cell language (frontend/) and the IR text parser (ir/IRParser).
// Both are small line-oriented languages with the same identifiers, numbers, punctuation and `#`
// comments, so one lexer keeps their error positions consistent.
#pragma once

#include "ir/Error.h"

#include <string>
#include <vector>

namespace rnnc {

enum class TokenKind { Identifier, Number, Punct, End };

struct Token {
  TokenKind kind = TokenKind::End;
  std::string text;
  int line = 0, col = 0; // 1-based
  bool is(const char* punct) const { return kind == TokenKind::Punct && text == punct; }
  bool isWord(const char* word) const { return kind == TokenKind::Identifier && text == word; }
};

class Lexer {
public:
  // Tokenizes the whole text; throws UserError at the first character it does not know.
  // Identifiers may contain dots between parts (`layernorm_i.weight`, `layers.0.weight`) so that
  // parameter names can be PyTorch state_dict names.
  Lexer(std::string source, std::string file);

  const Token& peek(size_t ahead = 0) const;
  Token next();
  // Consumes the punctuation or keyword if it is next.
  bool accept(const char* punctOrWord);
  Token expect(const char* punct, const char* context);
  Token expectWord(const char* word, const char* context);
  Token expectIdentifier(const char* what);
  Token expectNumber(const char* what);

  SourceLoc locOf(const Token& token) const;
  [[noreturn]] void errorAt(const Token& token, const std::string& message) const;
  const std::string& file() const { return file_; }

  static std::string describe(const Token& token); // "identifier 'x'", "')'", "end of file"

  // One level of a construct the parsers descend into (a parenthesis, a unary minus, a call's
  // arguments), held while they parse inside it: past kMaxNesting levels the parse stops with
  // an error at the token, where it would otherwise overflow the stack.
  class Nesting {
  public:
    Nesting(Lexer& lexer, const Token& at);
    ~Nesting() { --lexer_.depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

  private:
    Lexer& lexer_;
  };
  static constexpr int kMaxNesting = 256;

private:
  void tokenize();
  std::string source_, file_;
  std::vector<std::string> lines_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0; // Nesting levels now open
};

} // namespace rnnc
