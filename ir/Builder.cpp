#include "ir/Builder.h"

#include "ir/ShapeInference.h"

namespace rnnc::ir {

Value* Builder::make(size_t position, Op op, std::vector<Value*> operands, Attrs attrs,
                     const Dim* size) {
  std::vector<const Shape*> shapes;
  for (Value* operand : operands) {
    RNNC_INTERNAL_CHECK(operand, "null operand for " + std::string(opName(op)));
    shapes.push_back(&operand->shape);
  }
  Shape shape = inferShape(op, shapes, attrs, size);
  auto instr = std::make_unique<Instr>(op, std::move(operands), std::move(attrs), std::move(shape));
  Value* result = &instr->result;
  block_->insert(block_->begin() + static_cast<std::ptrdiff_t>(position), std::move(instr));
  return result;
}

Value* Builder::create(Op op, std::vector<Value*> operands, Attrs attrs) {
  RNNC_INTERNAL_CHECK(op != Op::Slice, "use Builder::slice for slices");
  return make(block_->size(), op, std::move(operands), std::move(attrs), nullptr);
}

Value* Builder::insert(size_t position, Op op, std::vector<Value*> operands, Attrs attrs) {
  RNNC_INTERNAL_CHECK(op != Op::Slice, "use Builder::slice for slices");
  return make(position, op, std::move(operands), std::move(attrs), nullptr);
}

Value* Builder::slice(Value* operand, Dim offset, Dim size) {
  Attrs attrs;
  attrs.offset = std::move(offset);
  return make(block_->size(), Op::Slice, {operand}, std::move(attrs), &size);
}

Value* Builder::constant(double value) {
  Attrs attrs;
  attrs.value = value;
  return create(Op::Const, {}, attrs);
}

} // namespace rnnc::ir
