#include "ir/Printer.h"

#include <fmt/format.h>

#include <sstream>

namespace rnnc::ir {
namespace {

class CellPrinter {
public:
  CellPrinter(std::ostream& os, const Cell& cell) : os_(os), cell_(cell) {}

  void print() {
    os_ << "cell @" << cell_.name << "(";
    for (size_t i = 0; i < cell_.sizeNames.size(); ++i) {
      const std::string& size = cell_.sizeNames[i];
      os_ << (i ? ", " : "") << size;
      if (auto it = cell_.sizes.find(size); it != cell_.sizes.end())
        os_ << " = " << it->second;
    }
    os_ << ") {\n";
    for (ArgKind kind : {ArgKind::Input, ArgKind::State, ArgKind::Param})
      for (const auto& arg : cell_.arguments(kind))
        os_ << "  " << argKindName(kind) << " %" << arg->name << " : " << shapeStr(arg->shape)
            << "\n";
    int counter = 0;
    for (const Block* block : {&cell_.pre, &cell_.step})
      for (const auto& instr : *block)
        numbers_[&instr->result] = counter++;
    if (!cell_.pre.empty())
      printBlock("pre", cell_.pre);
    printBlock("step", cell_.step);
    if (!cell_.updates.empty()) {
      os_ << "  yield ";
      for (size_t i = 0; i < cell_.updates.size(); ++i)
        os_ << (i ? ", " : "") << ref(cell_.updates[i].state) << " = "
            << ref(cell_.updates[i].next);
      os_ << "\n";
    }
    os_ << "  output " << ref(cell_.output) << "\n}\n";
  }

private:
  std::string ref(const Value* value) const {
    if (!value)
      return "%<null>";
    if (value->isArgument())
      return "%" + value->name;
    const int* number = numbers_.find(value);
    // Printing must never crash: the verifier prints broken IR in its error message.
    return number ? "%" + std::to_string(*number) : "%<undefined>";
  }

  void printBlock(const char* name, const Block& block) {
    os_ << "  " << name << " {\n";
    // Kernel numbers are not printed: a run of instructions with one number is a `fused` region.
    int open = -1;
    for (const auto& instr : block) {
      if (instr->kernel != open && open >= 0)
        os_ << "    }\n";
      if (instr->kernel != open && instr->kernel >= 0)
        os_ << "    fused {\n";
      open = instr->kernel;
      os_ << (open >= 0 ? "      " : "    ") << ref(&instr->result) << " = " << opName(instr->op);
      for (size_t i = 0; i < instr->operands.size(); ++i)
        os_ << (i ? ", " : " ") << ref(instr->operands[i]);
      printAttrs(*instr);
      os_ << " : " << shapeStr(instr->result.shape) << "\n";
    }
    if (open >= 0)
      os_ << "    }\n";
    os_ << "  }\n";
  }

  void printAttrs(const Instr& instr) {
    const std::span<const AttrField> fields = attrFields(opAttrKind(instr.op));
    if (fields.empty())
      return;
    os_ << " {";
    for (size_t i = 0; i < fields.size(); ++i)
      os_ << (i ? ", " : "") << fields[i].name << " = "
          << (fields[i].number ? formatNumber(instr.attrs.*fields[i].number)
                               : instr.attrs.offset.str());
    os_ << "}";
  }

  std::ostream& os_;
  const Cell& cell_;
  ValueMap<int> numbers_;
};

} // namespace

std::string formatNumber(double value) {
  return fmt::format("{}", value);
}

void print(std::ostream& os, const Cell& cell) {
  CellPrinter(os, cell).print();
}

std::string toString(const Cell& cell) {
  std::ostringstream os;
  print(os, cell);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Cell& cell) {
  print(os, cell);
  return os;
}

} // namespace rnnc::ir
