#include "ir/Lexer.h"

#include <cctype>

namespace rnnc {
namespace {

bool isIdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool isIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool isDigit(char c) {
  return std::isdigit(static_cast<unsigned char>(c));
}

constexpr std::string_view kPunctuation = "()[]{},=:;+-*/@^%";

} // namespace

Lexer::Nesting::Nesting(Lexer& lexer, const Token& at) : lexer_(lexer) {
  if (lexer.depth_ >= kMaxNesting)
    lexer.errorAt(at, "nested more than " + std::to_string(kMaxNesting) +
                          " levels deep (parentheses, calls or unary minus signs)");
  ++lexer.depth_;
}

Lexer::Lexer(std::string source, std::string file)
    : source_(std::move(source)), file_(std::move(file)) {
  size_t start = 0;
  for (size_t i = 0; i <= source_.size(); ++i)
    if (i == source_.size() || source_[i] == '\n') {
      std::string line = source_.substr(start, i - start);
      if (!line.empty() && line.back() == '\r')
        line.pop_back();
      lines_.push_back(line);
      start = i + 1;
    }
  tokenize();
}

void Lexer::tokenize() {
  int line = 1, col = 1;
  size_t i = 0;
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n; ++k, ++i) {
      if (source_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
  };
  while (i < source_.size()) {
    char c = source_[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      advance(1);
      continue;
    }
    if (c == '#' || (c == '/' && i + 1 < source_.size() && source_[i + 1] == '/')) {
      while (i < source_.size() && source_[i] != '\n')
        advance(1);
      continue;
    }
    Token token;
    token.line = line;
    token.col = col;
    size_t end = i;
    if (isIdentStart(c)) {
      token.kind = TokenKind::Identifier;
      while (end < source_.size()) {
        if (isIdentChar(source_[end]))
          ++end;
        // Dotted parts may start with a digit: PyTorch's `layers.0.weight`, the backward
        // cell's `kept.0`.
        else if (source_[end] == '.' && end + 1 < source_.size() && isIdentChar(source_[end + 1]))
          ++end;
        else
          break;
      }
    } else if (isDigit(c) || (c == '.' && i + 1 < source_.size() && isDigit(source_[i + 1]))) {
      token.kind = TokenKind::Number;
      while (end < source_.size() && (isDigit(source_[end]) || source_[end] == '.'))
        ++end;
      if (end < source_.size() && (source_[end] == 'e' || source_[end] == 'E')) {
        size_t exp = end + 1;
        if (exp < source_.size() && (source_[exp] == '+' || source_[exp] == '-'))
          ++exp;
        if (exp < source_.size() && isDigit(source_[exp])) {
          end = exp;
          while (end < source_.size() && isDigit(source_[end]))
            ++end;
        }
      }
    } else if (kPunctuation.find(c) != std::string_view::npos) {
      token.kind = TokenKind::Punct;
      end = i + 1;
    } else {
      token.kind = TokenKind::Punct;
      token.text = std::string(1, c);
      std::string shown = std::isprint(static_cast<unsigned char>(c))
                              ? "'" + token.text + "'"
                              : "byte 0x" + std::to_string(static_cast<unsigned char>(c));
      errorAt(token, "unexpected character " + shown);
    }
    token.text = source_.substr(i, end - i);
    advance(end - i);
    tokens_.push_back(std::move(token));
  }
  // Errors at the end of the file point just after the last token, on a line that exists.
  Token endToken;
  endToken.kind = TokenKind::End;
  endToken.line = tokens_.empty() ? 1 : tokens_.back().line;
  endToken.col =
      tokens_.empty() ? 1 : tokens_.back().col + static_cast<int>(tokens_.back().text.size());
  tokens_.push_back(endToken);
}

const Token& Lexer::peek(size_t ahead) const {
  return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
}

Token Lexer::next() {
  Token token = peek();
  if (pos_ < tokens_.size() - 1)
    ++pos_;
  return token;
}

bool Lexer::accept(const char* punctOrWord) {
  const Token& token = peek();
  if (token.kind == TokenKind::End || token.kind == TokenKind::Number || token.text != punctOrWord)
    return false;
  next();
  return true;
}

Token Lexer::expect(const char* punct, const char* context) {
  if (!peek().is(punct))
    errorAt(peek(),
            std::string("expected '") + punct + "' " + context + ", found " + describe(peek()));
  return next();
}

Token Lexer::expectWord(const char* word, const char* context) {
  if (!peek().isWord(word))
    errorAt(peek(),
            std::string("expected '") + word + "' " + context + ", found " + describe(peek()));
  return next();
}

Token Lexer::expectIdentifier(const char* what) {
  if (peek().kind != TokenKind::Identifier)
    errorAt(peek(), std::string("expected ") + what + ", found " + describe(peek()));
  return next();
}

Token Lexer::expectNumber(const char* what) {
  if (peek().kind != TokenKind::Number)
    errorAt(peek(), std::string("expected ") + what + ", found " + describe(peek()));
  return next();
}

SourceLoc Lexer::locOf(const Token& token) const {
  SourceLoc loc;
  loc.file = file_;
  loc.line = token.line;
  loc.col = token.col;
  loc.length = std::max<int>(1, static_cast<int>(token.text.size()));
  if (token.line >= 1 && token.line <= static_cast<int>(lines_.size()))
    loc.lineText = lines_[token.line - 1];
  return loc;
}

void Lexer::errorAt(const Token& token, const std::string& message) const {
  throwUserErrorAt(locOf(token), message);
}

std::string Lexer::describe(const Token& token) {
  switch (token.kind) {
  case TokenKind::End:
    return "end of file";
  case TokenKind::Identifier:
    return "'" + token.text + "'";
  case TokenKind::Number:
    return "number " + token.text;
  case TokenKind::Punct:
    return "'" + token.text + "'";
  }
  return "?";
}

} // namespace rnnc
