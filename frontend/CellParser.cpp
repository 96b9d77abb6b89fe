#include "frontend/CellParser.h"

#include "ir/Builder.h"
#include "ir/DimParser.h"
#include "ir/FileIO.h"
#include "ir/Lexer.h"
#include "ir/ShapeInference.h"
#include "ir/Verifier.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_map>

namespace rnnc::frontend {
namespace {

using ir::Dim;
using ir::Op;
using ir::Shape;
using ir::Value;

// What an expression evaluates to while parsing: an IR value, a number literal not yet
// materialised (so `clamp(x, -1, 1)` and `1 - z` stay simple), or a transposed weight `W^T`
// that only `@` may consume.
struct Operand {
  Value* value = nullptr;
  std::optional<double> number;
  bool transposed = false;
  Token token; // where the expression starts, for error carets
};

struct NameInfo {
  Value* value = nullptr;
  Token definedAt;
  bool used = false;
  bool isArgument = false;
};

class CellParser {
public:
  CellParser(const std::string& source, const std::string& file)
      : lexer_(source, file), cell_(std::make_unique<ir::Cell>()), builder_(*cell_, cell_->step) {}

  std::unique_ptr<ir::Cell> parse() {
    parseHeader();
    while (!lexer_.peek().isWord("return")) {
      const Token& t = lexer_.peek();
      if (t.kind == TokenKind::End || t.is("}"))
        lexer_.errorAt(t, "expected a 'return' statement before the end of the cell");
      if (t.isWord("input") || t.isWord("state") || t.isWord("param"))
        parseDeclaration();
      else
        parseAssignment();
    }
    parseReturn();
    lexer_.expect("}", "to close the cell");
    if (lexer_.peek().kind != TokenKind::End)
      lexer_.errorAt(lexer_.peek(),
                     "unexpected " + Lexer::describe(lexer_.peek()) + " after the end of the cell");
    checkEverythingUsed();
    ir::verify(*cell_);
    return std::move(cell_);
  }

private:
  // ---- Header and declarations --------------------------------------------------------------

  void parseHeader() {
    lexer_.expectWord("cell", "at the start of the file");
    cell_->name = lexer_.expectIdentifier("the cell's name").text;
    cell_->sizeNames = ir::parseSizeList(lexer_, /*withValues=*/false).names;
    lexer_.expect("{", "to open the cell body");
  }

  void parseDeclaration() {
    Token keyword = lexer_.next();
    ir::ArgKind kind = keyword.text == "input"   ? ir::ArgKind::Input
                       : keyword.text == "state" ? ir::ArgKind::State
                                                 : ir::ArgKind::Param;
    do {
      Token name = lexer_.expectIdentifier(("the " + keyword.text + "'s name").c_str());
      checkNotDefined(name);
      if (!lexer_.peek().is("["))
        lexer_.errorAt(lexer_.peek(), "expected the shape of '" + name.text +
                                          "' in brackets, e.g. " + name.text + "[hidden_size]");
      Token shapeStart = lexer_.peek();
      Shape shape = ir::parseShape(lexer_, [this](const Token& size) { checkSizeName(size); });
      if (kind == ir::ArgKind::Param) {
        if (shape.empty() || shape.size() > 2)
          lexer_.errorAt(shapeStart, "a param has one or two dimensions, e.g. [hidden_size] or "
                                     "[4*hidden_size, input_size]");
      } else {
        if (shape.size() != 1)
          lexer_.errorAt(shapeStart, "an " + keyword.text +
                                         " has one dimension (its features, e.g. [hidden_size]);"
                                         " the batch dimension is implicit");
        shape.insert(shape.begin(), Dim::symbol(ir::kBatchSymbol));
      }
      for (const Dim& d : shape)
        if (d.isConstant() && d.constantValue() <= 0)
          lexer_.errorAt(shapeStart, "dimensions must be positive, got " + ir::shapeStr(shape));
      Value* arg = cell_->addArgument(kind, name.text, shape);
      names_[name.text] = NameInfo{arg, name, false, true};
    } while (lexer_.accept(","));
  }

  void checkSizeName(const Token& size) {
    if (size.text == ir::kBatchSymbol)
      lexer_.errorAt(size, "'B' (the batch) is implicit in inputs and states; parameters cannot "
                           "depend on it");
    for (const auto& known : cell_->sizeNames)
      if (known == size.text)
        return;
    lexer_.errorAt(size, "unknown size '" + size.text +
                             "'; declare it in the cell header, e.g. "
                             "cell " +
                             cell_->name + "(..., " + size.text + ")");
  }

  void checkNotDefined(const Token& name) {
    auto it = names_.find(name.text);
    if (it != names_.end()) {
      std::string what =
          it->second.isArgument ? std::string(ir::argKindName(it->second.value->argKind)) : "value";
      lexer_.errorAt(name, fmt::format("'{}' is already defined as a{} {} at line {}, column {}",
                                       name.text, what == "input" ? "n" : "", what,
                                       it->second.definedAt.line, it->second.definedAt.col));
    }
    if (isReserved(name.text))
      lexer_.errorAt(name, "'" + name.text + "' is a reserved word");
  }

  // The statements' keywords and every built-in function's name (builtinFunctions()).
  static bool isReserved(const std::string& word) {
    static const char* keywords[] = {"cell", "input", "state", "param", "return", "output"};
    for (const char* k : keywords)
      if (word == k)
        return true;
    return findBuiltin(word) != nullptr;
  }

  // ---- Statements ---------------------------------------------------------------------------

  void parseAssignment() {
    std::vector<Token> targets;
    do {
      Token target = lexer_.expectIdentifier("a statement (name = expression)");
      checkNotDefined(target);
      for (const Token& earlier : targets)
        if (earlier.text == target.text)
          lexer_.errorAt(target, "'" + target.text + "' appears twice on the left of '='");
      targets.push_back(target);
    } while (lexer_.accept(","));
    lexer_.expect("=", "after the name(s) being assigned");

    if (lexer_.peek().isWord("chunk") && lexer_.peek(1).is("(")) {
      std::vector<Value*> parts = parseChunk(static_cast<int64_t>(targets.size()));
      for (size_t i = 0; i < targets.size(); ++i)
        define(targets[i], parts[i]);
      return;
    }
    if (targets.size() > 1)
      lexer_.errorAt(targets[1], "only chunk(x, n) produces several values; assign other "
                                 "expressions to one name");
    Operand rhs = parseExpression();
    define(targets[0], materialize(rhs));
  }

  void define(const Token& name, Value* value) { names_[name.text] = NameInfo{value, name}; }

  std::vector<Value*> parseChunk(int64_t count) {
    Token fn = lexer_.next();
    lexer_.expect("(", "after 'chunk'");
    Operand x = parseExpression();
    Value* value = requireValue(x, "chunk");
    lexer_.expect(",", "between chunk's operand and its number of parts");
    Token nToken = lexer_.peek();
    int64_t n = parseIntegerLiteral("the number of parts");
    lexer_.expect(")", "to close chunk(...)");
    if (n != count)
      lexer_.errorAt(nToken,
                     fmt::format("chunk into {} parts is assigned to {} name(s)", n, count));
    if (value->shape.empty())
      lexer_.errorAt(x.token, "cannot chunk a scalar");
    const Dim& extent = value->shape.back();
    auto part = extent.exactlyDividedBy(n);
    if (!part || !part->isProvablyPositive())
      lexer_.errorAt(fn, fmt::format("cannot chunk {} into {} equal parts: {} is not a multiple "
                                     "of {}",
                                     ir::shapeStr(value->shape), n, extent.str(), n));
    std::vector<Value*> parts;
    for (int64_t i = 0; i < n; ++i)
      parts.push_back(withLocation(fn, [&] { return builder_.slice(value, *part * i, *part); }));
    return parts;
  }

  void parseReturn() {
    lexer_.expectWord("return", "");
    std::vector<std::pair<Value*, Value*>> updates;
    if (!lexer_.peek().isWord("output") && !lexer_.peek().is(";")) {
      do {
        Token stateName = lexer_.expectIdentifier("a state name (return h = expression, ...)");
        auto it = names_.find(stateName.text);
        if (it == names_.end() || !it->second.isArgument ||
            it->second.value->argKind != ir::ArgKind::State)
          lexer_.errorAt(stateName, "'" + stateName.text +
                                        "' is not a state of this cell; return assigns the "
                                        "next value of each state");
        Value* state = it->second.value;
        for (const auto& [s, next] : updates)
          if (s == state)
            lexer_.errorAt(stateName, "state '" + stateName.text + "' is assigned twice");
        lexer_.expect("=", "after the state name");
        Operand next = parseExpression();
        Value* nextValue = materialize(next);
        if (nextValue->shape != state->shape)
          lexer_.errorAt(next.token, fmt::format("state '{}' has shape {} but its next value has "
                                                 "shape {}",
                                                 stateName.text, ir::shapeStr(state->shape),
                                                 ir::shapeStr(nextValue->shape)));
        updates.push_back({state, nextValue});
      } while (lexer_.accept(","));
    }
    lexer_.accept(";");
    if (!lexer_.peek().isWord("output"))
      lexer_.errorAt(lexer_.peek(), "expected 'output <expression>' after the return list, found " +
                                        Lexer::describe(lexer_.peek()));
    lexer_.next();
    Operand out = parseExpression();
    Value* output = materialize(out);
    if (output->shape.size() != 2 || output->shape[0] != Dim::symbol(ir::kBatchSymbol))
      lexer_.errorAt(out.token, "the output must be a per-step value of shape [B, F], got " +
                                    ir::shapeStr(output->shape));
    cell_->output = output;

    for (const auto& state : cell_->states) {
      Value* next = nullptr;
      for (const auto& [s, n] : updates)
        if (s == state.get())
          next = n;
      if (!next)
        lexer_.errorAt(names_[state->name].definedAt,
                       "state '" + state->name +
                           "' is never updated: give its next value in "
                           "the return statement (return " +
                           state->name + " = ...)");
      cell_->updates.push_back({state.get(), next});
    }
  }

  void checkEverythingUsed() {
    for (ir::ArgKind kind : {ir::ArgKind::Input, ir::ArgKind::Param})
      for (const auto& arg : cell_->arguments(kind)) {
        const NameInfo& info = names_[arg->name];
        if (!info.used)
          lexer_.errorAt(info.definedAt,
                         std::string(kind == ir::ArgKind::Param ? "parameter" : "input") + " '" +
                             arg->name + "' is never used");
      }
  }

  // ---- Expressions --------------------------------------------------------------------------
  //   expr   := term (('+' | '-') term)*
  //   term   := unary (('*' | '/' | '@') unary)*
  //   unary  := '-' unary | postfix
  //   postfix:= primary ['^' 'T']
  //   primary:= NUMBER | NAME | NAME '(' args ')' | '(' expr ')'

  Operand parseExpression() {
    Operand lhs = parseTerm();
    while (lexer_.peek().is("+") || lexer_.peek().is("-")) {
      Token op = lexer_.next();
      Operand rhs = parseTerm();
      lhs = binary(op.is("+") ? Op::Add : Op::Sub, op, lhs, rhs);
    }
    return lhs;
  }

  Operand parseTerm() {
    Operand lhs = parseUnary();
    while (lexer_.peek().is("*") || lexer_.peek().is("/") || lexer_.peek().is("@")) {
      Token op = lexer_.next();
      Operand rhs = parseUnary();
      if (op.is("@"))
        lhs = matmul(op, lhs, rhs);
      else
        lhs = binary(op.is("*") ? Op::Mul : Op::Div, op, lhs, rhs);
    }
    return lhs;
  }

  Operand parseUnary() {
    if (lexer_.peek().is("-")) {
      Token minus = lexer_.next();
      Lexer::Nesting nesting(lexer_, minus);
      Operand x = parseUnary();
      if (x.number) {
        x.number = -*x.number;
        x.token = minus;
        return x;
      }
      return result(minus, withLocation(minus, [&] {
                      return builder_.create(Op::Neg, {requireValue(x, "'-'")});
                    }));
    }
    Operand x = parsePrimary();
    if (lexer_.peek().is("^")) {
      Token caret = lexer_.next();
      Token t = lexer_.expectIdentifier("'T' after '^' (transpose)");
      if (t.text != "T")
        lexer_.errorAt(t, "only '^T' (transpose) is supported after '^'");
      if (!x.value || x.value->shape.size() != 2 || x.value->shape[0].mentions(ir::kBatchSymbol))
        lexer_.errorAt(caret, "only a weight matrix (a param of rank 2) can be transposed");
      x.transposed = true;
    }
    return x;
  }

  Operand parsePrimary() {
    const Token& t = lexer_.peek();
    if (t.kind == TokenKind::Number) {
      Token number = lexer_.next();
      Operand x;
      x.number = parseNumber(number);
      x.token = number;
      return x;
    }
    if (t.is("(")) {
      Token open = lexer_.next();
      Lexer::Nesting nesting(lexer_, open);
      Operand inner = parseExpression();
      lexer_.expect(")", "to close the parenthesis");
      inner.token = open;
      return inner;
    }
    if (t.kind == TokenKind::Identifier) {
      Token name = lexer_.next();
      if (lexer_.peek().is("("))
        return parseCall(name);
      auto it = names_.find(name.text);
      if (it == names_.end())
        lexer_.errorAt(name, "unknown name '" + name.text + "'");
      it->second.used = true;
      Operand x;
      x.value = it->second.value;
      x.token = name;
      return x;
    }
    lexer_.errorAt(t, "expected an expression, found " + Lexer::describe(t));
  }

  struct CallArgs {
    std::vector<Operand> positional;
    std::unordered_map<std::string, std::pair<Token, Operand>> keywords;
  };

  CallArgs parseCallArgs() {
    CallArgs args;
    lexer_.expect("(", "to open the argument list");
    if (!lexer_.peek().is(")")) {
      do {
        if (lexer_.peek().kind == TokenKind::Identifier && lexer_.peek(1).is("=")) {
          Token key = lexer_.next();
          lexer_.next();
          if (args.keywords.count(key.text))
            lexer_.errorAt(key, "argument '" + key.text + "' is given twice");
          args.keywords[key.text] = {key, parseExpression()};
        } else {
          if (!args.keywords.empty())
            lexer_.errorAt(lexer_.peek(), "positional argument after a keyword argument");
          args.positional.push_back(parseExpression());
        }
      } while (lexer_.accept(","));
    }
    lexer_.expect(")", "to close the argument list");
    return args;
  }

  void checkArgCount(const Token& fn, const CallArgs& args, size_t min, size_t max,
                     const char* usage) {
    if (args.positional.size() < min || args.positional.size() > max)
      lexer_.errorAt(
          fn, fmt::format("{} takes {} argument{}, got {}; usage: {}", fn.text,
                          min == max ? std::to_string(min) : fmt::format("{} to {}", min, max),
                          max == 1 ? "" : "s", args.positional.size(), usage));
  }

  void checkKeywords(const Token& fn, const CallArgs& args,
                     std::initializer_list<const char*> allowed) {
    for (const auto& [key, entry] : args.keywords) {
      bool ok = false;
      for (const char* a : allowed)
        ok |= key == a;
      if (!ok)
        lexer_.errorAt(entry.first, fn.text + " has no argument named '" + key + "'");
    }
  }

  // The cell language's built-in functions, each named once: what reserves its name, what the
  // call parses to, and the list an unknown name's error gives (in this order).
  using CallParser = Operand (CellParser::*)(const Token& fn, const CallArgs& args);
  struct Builtin {
    const char* name;
    CallParser parse; // null for chunk, which only an assignment of several names can call
    Op op = Op::Add;  // what callElementwise builds for the one-operand functions
  };
  static const std::vector<Builtin>& builtinFunctions() {
    static const std::vector<Builtin> builtins = {
        {"linear", &CellParser::callLinear},
        {"sigmoid", &CellParser::callElementwise, Op::Sigmoid},
        {"tanh", &CellParser::callElementwise, Op::Tanh},
        {"relu", &CellParser::callElementwise, Op::Relu},
        {"exp", &CellParser::callElementwise, Op::Exp},
        {"log", &CellParser::callElementwise, Op::Log},
        {"sqrt", &CellParser::callElementwise, Op::Sqrt},
        {"min", &CellParser::callMinMax, Op::Min},
        {"max", &CellParser::callMinMax, Op::Max},
        {"clamp", &CellParser::callClamp},
        {"chunk", nullptr},
        {"cat", &CellParser::callCat},
        {"layernorm", &CellParser::layerNorm},
        {"dropout", &CellParser::callDropout},
    };
    return builtins;
  }
  static const Builtin* findBuiltin(const std::string& name) {
    for (const Builtin& builtin : builtinFunctions())
      if (name == builtin.name)
        return &builtin;
    return nullptr;
  }

  Operand parseCall(const Token& fn) {
    const Builtin* builtin = findBuiltin(fn.text);
    if (!builtin) {
      std::string known;
      for (const Builtin& b : builtinFunctions())
        known += (known.empty() ? "" : ", ") + std::string(b.name);
      lexer_.errorAt(fn, "unknown function '" + fn.text + "'; known: " + known);
    }
    if (!builtin->parse)
      lexer_.errorAt(fn, "chunk(x, n) must be assigned to n names: a, b = chunk(x, 2)");
    Lexer::Nesting nesting(lexer_, fn);
    CallArgs args = parseCallArgs();
    if (fn.text != "layernorm")
      checkKeywords(fn, args, {});
    return (this->*builtin->parse)(fn, args);
  }

  Operand callElementwise(const Token& fn, const CallArgs& args) {
    checkArgCount(fn, args, 1, 1, (fn.text + "(x)").c_str());
    Value* x = requireValue(args.positional[0], fn.text.c_str());
    const Op op = findBuiltin(fn.text)->op;
    return result(fn, withLocation(fn, [&] { return builder_.create(op, {x}); }));
  }

  Operand callMinMax(const Token& fn, const CallArgs& args) {
    checkArgCount(fn, args, 2, 2, (fn.text + "(a, b)").c_str());
    return binary(findBuiltin(fn.text)->op, fn, args.positional[0], args.positional[1]);
  }

  Operand callClamp(const Token& fn, const CallArgs& args) {
    checkArgCount(fn, args, 3, 3, "clamp(x, lo, hi) with number bounds");
    ir::Attrs attrs;
    attrs.lo = requireNumber(args.positional[1], "clamp's lower bound");
    attrs.hi = requireNumber(args.positional[2], "clamp's upper bound");
    if (!(attrs.lo <= attrs.hi))
      lexer_.errorAt(args.positional[1].token, "clamp's lower bound exceeds its upper bound");
    Value* x = requireValue(args.positional[0], "clamp");
    return result(fn, withLocation(fn, [&] { return builder_.create(Op::Clamp, {x}, attrs); }));
  }

  Operand callDropout(const Token& fn, const CallArgs& args) {
    checkArgCount(fn, args, 2, 2, "dropout(x, p) with 0 <= p < 1");
    ir::Attrs attrs;
    attrs.value = requireNumber(args.positional[1], "dropout's probability");
    if (!(attrs.value >= 0 && attrs.value < 1))
      lexer_.errorAt(args.positional[1].token, "dropout's probability must be in [0, 1)");
    Value* x = requireValue(args.positional[0], "dropout");
    return result(fn, withLocation(fn, [&] { return builder_.create(Op::Dropout, {x}, attrs); }));
  }

  Operand callLinear(const Token& fn, const CallArgs& args) {
    checkArgCount(fn, args, 2, 3, "linear(x, weight) or linear(x, weight, bias)");
    Value* x = requireValue(args.positional[0], "linear");
    Value* w = requireValue(args.positional[1], "linear");
    Value* y = withLocation(fn, [&] { return builder_.create(Op::Linear, {x, w}); });
    if (args.positional.size() == 3) {
      Value* b = requireValue(args.positional[2], "linear");
      y = withLocation(fn, [&] { return builder_.create(Op::Add, {y, b}); });
    }
    return result(fn, y);
  }

  Operand callCat(const Token& fn, const CallArgs& args) {
    if (args.positional.empty())
      lexer_.errorAt(fn, "cat takes one or more values: cat(a, b, ...)");
    std::vector<Value*> parts;
    for (const Operand& part : args.positional)
      parts.push_back(requireValue(part, "cat"));
    return result(fn, withLocation(fn, [&] { return builder_.create(Op::Concat, parts); }));
  }

  // layernorm(x), layernorm(x, weight), layernorm(x, weight, bias), each with optional eps=...
  // The IR op only normalises; the affine part is an ordinary mul and add so passes can fuse it.
  Operand layerNorm(const Token& fn, const CallArgs& args) {
    checkKeywords(fn, args, {"eps"});
    checkArgCount(fn, args, 1, 3, "layernorm(x [, weight [, bias]] [, eps=1e-5])");
    ir::Attrs attrs;
    attrs.value = 1e-5; // PyTorch's default
    if (auto it = args.keywords.find("eps"); it != args.keywords.end()) {
      attrs.value = requireNumber(it->second.second, "eps");
      if (!(attrs.value > 0))
        lexer_.errorAt(it->second.first, "eps must be positive");
    }
    Value* x = requireValue(args.positional[0], "layernorm");
    Value* y = withLocation(fn, [&] { return builder_.create(Op::LayerNorm, {x}, attrs); });
    for (size_t i = 1; i < args.positional.size(); ++i) {
      Value* p = requireValue(args.positional[i], "layernorm");
      if (p->shape.size() != 1 || x->shape.empty() || p->shape[0] != x->shape.back())
        lexer_.errorAt(
            args.positional[i].token,
            fmt::format("layernorm's {} must have shape [{}], got {}", i == 1 ? "weight" : "bias",
                        x->shape.empty() ? "?" : x->shape.back().str(), ir::shapeStr(p->shape)));
      y = withLocation(fn, [&] { return builder_.create(i == 1 ? Op::Mul : Op::Add, {y, p}); });
    }
    return result(fn, y);
  }

  Operand binary(Op op, const Token& at, const Operand& lhs, const Operand& rhs) {
    if (lhs.number && rhs.number) {
      Operand folded;
      folded.number = foldNumbers(op, *lhs.number, *rhs.number);
      folded.token = lhs.token;
      return folded;
    }
    Value* a = materialize(lhs);
    Value* b = materialize(rhs);
    Operand out = result(at, withLocation(at, [&] { return builder_.create(op, {a, b}); }));
    out.token = lhs.token;
    return out;
  }

  static double foldNumbers(Op op, double a, double b) {
    switch (op) {
    case Op::Add:
      return a + b;
    case Op::Sub:
      return a - b;
    case Op::Mul:
      return a * b;
    case Op::Div:
      return a / b;
    case Op::Min:
      return std::min(a, b);
    case Op::Max:
      return std::max(a, b);
    default:
      RNNC_INTERNAL_CHECK(false, "cannot fold op");
    }
  }

  Operand matmul(const Token& at, const Operand& lhs, const Operand& rhs) {
    Value* x = requireValue(lhs, "'@'");
    if (!rhs.value)
      lexer_.errorAt(rhs.token, "the right side of '@' must be a matrix");
    Op op = rhs.transposed ? Op::Linear : Op::MatMul;
    Operand out = result(at, withLocation(at, [&] { return builder_.create(op, {x, rhs.value}); }));
    out.token = lhs.token;
    return out;
  }

  // ---- Helpers ------------------------------------------------------------------------------

  template <class F> Value* withLocation(const Token& at, F&& make) {
    try {
      return make();
    } catch (const ir::ShapeError& e) {
      lexer_.errorAt(at, e.what());
    }
  }

  Operand result(const Token& at, Value* value) {
    Operand x;
    x.value = value;
    x.token = at;
    return x;
  }

  Value* materialize(const Operand& x) {
    if (x.transposed)
      lexer_.errorAt(x.token, "a transposed matrix (^T) can only be the right side of '@'");
    if (x.number)
      return builder_.constant(*x.number);
    return x.value;
  }

  Value* requireValue(const Operand& x, const char* context) {
    if (x.number)
      lexer_.errorAt(x.token, std::string(context) + " needs a tensor here, not a number");
    return materialize(x);
  }

  double requireNumber(const Operand& x, const char* what) {
    if (!x.number)
      lexer_.errorAt(x.token, std::string(what) + " must be a number");
    return *x.number;
  }

  double parseNumber(const Token& token) {
    errno = 0;
    char* end = nullptr;
    double value = std::strtod(token.text.c_str(), &end);
    if (*end != '\0' || errno == ERANGE || !std::isfinite(value))
      lexer_.errorAt(token, "'" + token.text + "' is not a valid number");
    return value;
  }

  int64_t parseIntegerLiteral(const char* what) {
    Token token = lexer_.expectNumber(what);
    errno = 0;
    char* end = nullptr;
    long long value = std::strtoll(token.text.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE || value <= 0)
      lexer_.errorAt(token, std::string(what) + " must be a positive integer");
    return value;
  }

  Lexer lexer_;
  std::unique_ptr<ir::Cell> cell_;
  ir::Builder builder_;
  std::unordered_map<std::string, NameInfo> names_;
};

} // namespace

std::unique_ptr<ir::Cell> parseCell(const std::string& source, const std::string& file) {
  return CellParser(source, file).parse();
}

std::unique_ptr<ir::Cell> parseCellFile(const std::string& path) {
  return parseCell(readFileBytes(path, "cell file"), path);
}

} // namespace rnnc::frontend
