#include "ir/IRParser.h"

#include "ir/Builder.h"
#include "ir/DimParser.h"
#include "ir/Printer.h"
#include "ir/ShapeInference.h"
#include "ir/Verifier.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <unordered_map>

namespace rnnc::ir {
namespace {

class IRParser {
public:
  IRParser(const std::string& text, const std::string& file) : lexer_(text, file) {}

  std::unique_ptr<Cell> parse() {
    cell_ = std::make_unique<Cell>();
    parseHeader();
    while (isArgumentKeyword(lexer_.peek()))
      parseArgument();
    if (lexer_.peek().isWord("pre"))
      parseBlock("pre", cell_->pre, /*inPre=*/true);
    if (!lexer_.peek().isWord("step"))
      lexer_.errorAt(lexer_.peek(), "expected an argument, 'pre' or 'step', found " +
                                        Lexer::describe(lexer_.peek()));
    parseBlock("step", cell_->step, /*inPre=*/false);
    if (lexer_.accept("yield"))
      parseYield();
    lexer_.expectWord("output", "after the step block");
    outputToken_ = lexer_.peek();
    cell_->output = parseValueRef(/*inPre=*/false);
    lexer_.expect("}", "to close the cell");
    if (lexer_.peek().kind != TokenKind::End)
      lexer_.errorAt(lexer_.peek(),
                     "unexpected " + Lexer::describe(lexer_.peek()) + " after the end of the cell");
    verify(*cell_);
    return std::move(cell_);
  }

private:
  static bool isArgumentKeyword(const Token& t) {
    return t.isWord("input") || t.isWord("state") || t.isWord("param");
  }

  void parseHeader() {
    lexer_.expectWord("cell", "at the start of the IR");
    lexer_.expect("@", "before the cell name");
    cell_->name = lexer_.expectIdentifier("the cell name").text;
    SizeList sizes = parseSizeList(lexer_, /*withValues=*/true);
    cell_->sizeNames = std::move(sizes.names);
    for (const auto& [name, value] : sizes.values)
      cell_->sizes[name] = value;
    lexer_.expect("{", "to open the cell body");
  }

  Shape parseShapeHere() {
    Shape shape = parseShape(lexer_, [this](const Token& name) {
      bool known = name.text == kBatchSymbol ||
                   std::find(cell_->sizeNames.begin(), cell_->sizeNames.end(), name.text) !=
                       cell_->sizeNames.end();
      if (!known)
        lexer_.errorAt(name, "unknown size '" + name.text + "'");
    });
    return substituteShape(shape, cell_->sizes);
  }

  void parseArgument() {
    Token keyword = lexer_.next();
    ArgKind kind = keyword.text == "input"   ? ArgKind::Input
                   : keyword.text == "state" ? ArgKind::State
                                             : ArgKind::Param;
    lexer_.expect("%", "before the argument name");
    Token name = lexer_.expectIdentifier("the argument name");
    if (values_.count(name.text))
      lexer_.errorAt(name, "'%" + name.text + "' is defined twice");
    lexer_.expect(":", "before the argument's shape");
    Value* arg = cell_->addArgument(kind, name.text, parseShapeHere());
    values_[name.text] = arg;
  }

  std::string parseValueName() {
    lexer_.expect("%", "before a value name");
    const Token& token = lexer_.peek();
    if (token.kind != TokenKind::Identifier && token.kind != TokenKind::Number)
      lexer_.errorAt(token, "expected a value name after '%', found " + Lexer::describe(token));
    return lexer_.next().text;
  }

  Value* parseValueRef(bool inPre) {
    Token at = lexer_.peek();
    std::string name = parseValueName();
    auto it = values_.find(name);
    if (it == values_.end())
      lexer_.errorAt(at, "use of undefined value '%" + name + "'");
    Value* value = it->second;
    if (inPre && value->isArgument() && value->argKind == ArgKind::State)
      lexer_.errorAt(at, "the pre block cannot use state '%" + name +
                             "': it runs before the time loop");
    return value;
  }

  double parseNumberAttr() {
    bool negative = lexer_.accept("-");
    Token number = lexer_.expectNumber("a number");
    errno = 0;
    char* end = nullptr;
    double value = std::strtod(number.text.c_str(), &end);
    if (*end != '\0' || errno == ERANGE)
      lexer_.errorAt(number, "'" + number.text + "' is not a valid number");
    return negative ? -value : value;
  }

  // Parses `{name = value, ...}` for the attributes the op carries, in any order, each once.
  Attrs parseAttrs(Op op, const Token& opToken) {
    Attrs attrs;
    const std::span<const AttrField> fields = attrFields(opAttrKind(op));
    std::vector<std::string> seen;
    if (lexer_.accept("{")) {
      do {
        Token name = lexer_.expectIdentifier("an attribute name");
        auto field = std::find_if(fields.begin(), fields.end(),
                                  [&](const AttrField& f) { return name.text == f.name; });
        if (field == fields.end())
          lexer_.errorAt(name, std::string(opName(op)) + " has no attribute '" + name.text + "'");
        if (std::find(seen.begin(), seen.end(), name.text) != seen.end())
          lexer_.errorAt(name, "attribute '" + name.text + "' is given twice");
        seen.push_back(name.text);
        lexer_.expect("=", "after the attribute name");
        if (field->number)
          attrs.*field->number = parseNumberAttr();
        else
          attrs.offset = parseDim(lexer_, nullptr).substitute(cell_->sizes);
      } while (lexer_.accept(","));
      lexer_.expect("}", "to close the attributes");
    }
    for (const AttrField& field : fields)
      if (std::find(seen.begin(), seen.end(), field.name) == seen.end())
        lexer_.errorAt(opToken, std::string(opName(op)) + " needs attribute '" + field.name + "'");
    return attrs;
  }

  void parseInstr(Block& block, bool inPre) {
    Token defToken = lexer_.peek();
    std::string name = parseValueName();
    if (values_.count(name))
      lexer_.errorAt(defToken, "'%" + name + "' is defined twice");
    lexer_.expect("=", "after the result name");
    Token opToken = lexer_.expectIdentifier("an op name");
    auto op = opFromName(opToken.text);
    if (!op)
      lexer_.errorAt(opToken, "unknown op '" + opToken.text + "'");
    std::vector<Value*> operands;
    if (lexer_.peek().is("%")) {
      do {
        operands.push_back(parseValueRef(inPre));
      } while (lexer_.accept(","));
    }
    Attrs attrs = parseAttrs(*op, opToken);
    lexer_.expect(":", "before the result shape");
    Token shapeToken = lexer_.peek();
    Shape written = parseShapeHere();

    Builder builder(*cell_, block);
    Value* result = nullptr;
    try {
      if (*op == Op::Slice) {
        if (operands.size() != 1)
          lexer_.errorAt(opToken,
                         "slice takes one operand, not " + std::to_string(operands.size()));
        if (written.empty())
          lexer_.errorAt(shapeToken, "a slice's result cannot be a scalar");
        result = builder.slice(operands[0], attrs.offset, written.back());
      } else {
        result = builder.create(*op, operands, attrs);
      }
    } catch (const ShapeError& e) {
      lexer_.errorAt(opToken, e.what());
    }
    if (result->shape != written)
      lexer_.errorAt(shapeToken, "the shape rules give " + shapeStr(result->shape) + " for this " +
                                     std::string(opName(*op)) + ", not " + shapeStr(written));
    values_[name] = result;
  }

  void parseBlock(const char* name, Block& block, bool inPre) {
    lexer_.expectWord(name, "");
    lexer_.expect("{", std::string("to open the " + std::string(name) + " block").c_str());
    while (!lexer_.peek().is("}") && lexer_.peek().kind != TokenKind::End) {
      if (lexer_.accept("fused")) {
        lexer_.expect("{", "to open the fused kernel");
        int kernel = nextKernel_++;
        size_t first = block.size();
        while (!lexer_.peek().is("}") && lexer_.peek().kind != TokenKind::End) {
          Token at = lexer_.peek();
          parseInstr(block, inPre);
          // A matrix product may lead its kernel (passes/FuseMatMul.h); the verifier checks
          // that it comes first and that only slices in the kernel read it.
          Op op = block.back()->op;
          bool leadingProduct = isMatrixProduct(op) && block.size() == first + 1;
          if (!isFusible(op) && !leadingProduct)
            lexer_.errorAt(at, std::string(opName(op)) + " cannot be part of a fused kernel");
        }
        lexer_.expect("}", "to close the fused kernel");
        if (block.size() == first)
          lexer_.errorAt(lexer_.peek(), "a fused kernel needs at least one instruction");
        for (size_t i = first; i < block.size(); ++i)
          block[i]->kernel = kernel;
        continue;
      }
      parseInstr(block, inPre);
    }
    lexer_.expect("}", "to close the block");
  }

  void parseYield() {
    do {
      Token at = lexer_.peek();
      Value* state = parseValueRef(false);
      if (!state->isArgument() || state->argKind != ArgKind::State)
        lexer_.errorAt(at, "yield assigns states; this value is not a state");
      if (cell_->updateOf(state))
        lexer_.errorAt(at, "state '%" + state->name + "' is updated twice");
      lexer_.expect("=", "after the state in yield");
      Value* next = parseValueRef(false);
      cell_->updates.push_back({state, next});
    } while (lexer_.accept(","));
    // Keep updates in state order so that printing is canonical whatever order the text used.
    auto stateIndex = [this](const Value* state) {
      for (size_t i = 0; i < cell_->states.size(); ++i)
        if (cell_->states[i].get() == state)
          return i;
      return cell_->states.size();
    };
    std::stable_sort(cell_->updates.begin(), cell_->updates.end(),
                     [&](const StateUpdate& a, const StateUpdate& b) {
                       return stateIndex(a.state) < stateIndex(b.state);
                     });
  }

  Lexer lexer_;
  std::unique_ptr<Cell> cell_;
  std::unordered_map<std::string, Value*> values_;
  Token outputToken_;
  int nextKernel_ = 0;
};

} // namespace

std::unique_ptr<Cell> parseIR(const std::string& text, const std::string& file) {
  return IRParser(text, file).parse();
}

} // namespace rnnc::ir
