"""A cell's forward in torch's own operations, read from its IR as parsed (rnnc compile CELL --emit
ir), over whole sequences as rnnc's layers run them: for a second derivative through a custom
cell, which needs a forward that autograd records (rnnc's derived backward is first order).

The IR's step is a list of instructions, one operation each (ir/Ops.def), evaluated here in order
on torch tensors; the sequence runs it step by step, layer by layer and in both directions, with
lengths as rnnc's runtime takes them: a sequence's state stops at its last step, and its output
is zero past it (in reverse, each sequence starts at its own last step)."""

import re

import torch
import torch.nn.functional as F

from . import _rnnc
from ._dropout_masks import CellMasks, between_layers, mask_rows

# `%5 = clamp %4 {lo = -2.5, hi = 3} : [B, 4]`: result, operation, operands, attributes, shape.
_INSTRUCTION = re.compile(r"%([\w.]+) = (\w+)((?: %[\w.]+,?)*)(?: \{([^}]*)\})? : \[([^\]]*)\]$")
_DECLARATION = re.compile(r"(input|state|param) %([\w.]+) : \[([^\]]*)\]$")

_UNARY = {"neg": torch.neg, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu,
          "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt}
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
           "min": torch.minimum, "max": torch.maximum, "linear": F.linear,
           "matmul": torch.matmul}


def rounded_as(value, dtype):
    """value rounded to `dtype` (torch.bfloat16 or torch.float16, to nearest even, as rnnc rounds
    its weights and Eigen its reference's) where it enters a product, with the derivative of the
    identity: mixed-precision training differentiates through the rounding so (its gradients are
    those at the rounded values), and so does its second derivative."""
    return value + (value.to(dtype).float() - value).detach()


def rounded_product(product, products):
    """`product` (F.linear or torch.matmul) taking its operands as rnnc's mixed-precision
    products do (runtime/exec/Interpreter.cpp): bf16 rounds both, fp16 the weights alone."""
    if products == "bf16":
        return lambda x, w: product(rounded_as(x, torch.bfloat16), rounded_as(w, torch.bfloat16))
    if products == "fp16":
        return lambda x, w: product(x, rounded_as(w, torch.float16))
    return product


class TorchCell:
    """One step of a cell, from its parsed IR: step(values) maps the inputs', states' and
    parameters' tensors by name to the new states (by name) and the output. `products`: the
    weights_dtype its products run as (fp32, or mixed precision's bf16 or fp16)."""

    def __init__(self, text, products="fp32"):
        self.binary = dict(_BINARY, linear=rounded_product(F.linear, products),
                           matmul=rounded_product(torch.matmul, products))
        self.inputs, self.states, self.params = [], [], []
        self.widths = {}
        self.instructions = []
        self.yields, self.output = {}, None
        # Each dropout's number (rnnc's: in the cell's order) and, for a dropout of parameters
        # alone (no batch dimension), the shape of its one mask.
        self.dropouts = {}
        for line in (line.strip() for line in text.splitlines()):
            declared = _DECLARATION.match(line)
            instruction = _INSTRUCTION.match(line)
            if declared:
                kind, name, shape = declared.groups()
                {"input": self.inputs, "state": self.states, "param": self.params}[kind].append(
                    name)
                self.widths[name] = int(shape.split(",")[-1])
            elif instruction:
                result, op, operands, attributes, shape = instruction.groups()
                if op == "dropout":
                    dims = [d.strip() for d in shape.split(",")] if shape else []
                    self.dropouts[result] = (len(self.dropouts), None if dims[:1] == ["B"] else
                                             tuple(int(d) for d in dims))
                self.widths[result] = int(shape.split(",")[-1]) if shape else None
                self.instructions.append((
                    result, op, re.findall(r"%([\w.]+)", operands or ""),
                    dict(_attribute(a) for a in attributes.split(",")) if attributes else {},
                    int(shape.split(",")[-1]) if shape else None))
            elif line.startswith("yield "):
                self.yields = dict(re.findall(r"%([\w.]+) = %([\w.]+)", line))
            elif line.startswith("output "):
                self.output = line.split("%", 1)[1]
        unknown = {op for _, op, *_ in self.instructions} - set(_UNARY) - set(_BINARY) - {
            "const", "slice", "concat", "stack", "clamp", "dropout", "step", "layernorm"}
        if unknown or self.output is None or set(self.yields) != set(self.states):
            raise ValueError(f"rnnc: no torch form of this cell's IR ({', '.join(unknown)})")

    def step(self, values, masks=None, t=None):
        """`masks`: in a training call, the masks its dropouts drew (_dropout_masks.CellMasks),
        this being step t of the padded sequence; None: dropout is the identity (eval)."""
        values = dict(values)
        for result, op, operands, attributes, width in self.instructions:
            args = [values[name] for name in operands]
            if op in _UNARY:
                value = _UNARY[op](*args)
            elif op in _BINARY:
                value = self.binary[op](*args)
            elif op == "const":
                value = torch.tensor(attributes["value"], dtype=torch.float32)
            elif op == "slice":
                offset = int(attributes["offset"])
                value = args[0][..., offset:offset + width]
            elif op == "concat":
                value = torch.cat(args, -1)
            elif op == "stack":
                value = torch.cat(args, 0)
            elif op == "clamp":
                value = torch.clamp(args[0], attributes["lo"], attributes["hi"])
            elif op == "dropout":
                value = args[0] if masks is None else args[0] * self._mask(
                    result, attributes["p"], width, masks, t)
            elif op == "step":
                value = torch.where(torch.isnan(args[0]), args[0],
                                    (args[0] > 0).to(args[0].dtype))
            else:  # layernorm
                value = F.layer_norm(args[0], (args[0].shape[-1],), eps=attributes["eps"])
            values[result] = value
        return {state: values[self.yields[state]] for state in self.states}, values[self.output]

    def _mask(self, result, p, width, masks, t):
        stream, shape = self.dropouts[result]
        if shape is None:
            return masks.of_rows(stream, p, width, t)
        return masks.of_parameter(stream, p, shape)


def _attribute(text):
    name, value = (part.strip() for part in text.split("="))
    return name, float(value)


def ir_recurrence(cell, sizes, input_size_name, num_layers, bidirectional, batch_first, lengths,
                  drawn=None):
    """f(x, initial states, side inputs, parameters, products="fp32") -> (y, finals) for any
    cell, in torch's operations: parameters in rnnc.nn.Recurrent's order (layer, direction, the
    cell's), a state given as None starting at zero, `lengths` (numpy, the batch's order) or
    None; `products` the weights_dtype of a mixed-precision call (see TorchCell). `drawn`: a
    training call's (seed, p between layers), whose dropout masks the forward applies as rnnc
    drew them (_dropout_masks.py); None: no masks (eval, or no dropout)."""
    directions = 2 if bidirectional else 1

    def step_cells(products):
        """The first layer's step and the step of those above (they read the layer below,
        both directions side by side), read when a second derivative first needs them."""
        first = TorchCell(_rnnc.parsed_cell_ir(cell, sizes), products)
        if num_layers == 1:
            return first, first
        return first, TorchCell(_rnnc.parsed_cell_ir(
            cell, dict(sizes, **{input_size_name: first.widths[first.output] * directions})),
            products)

    def forward(x, initial, sides, params, products="fp32"):
        first, above = step_cells(products)
        if batch_first:
            x, sides = x.transpose(0, 1), [s.transpose(0, 1) for s in sides]
        steps, batch = x.shape[0], x.shape[1]
        valid = None
        if lengths is not None:  # [T, B, 1]: whether step t is one of sequence b's
            valid = (torch.arange(steps)[:, None] < torch.as_tensor(lengths)[None, :])[..., None]
        finals = [[] for _ in first.states]
        params = list(params)
        for layer in range(num_layers):
            step_cell = first if layer == 0 else above
            outputs = []
            for direction in range(directions):
                slot = layer * directions + direction
                weights = dict(zip(step_cell.params, params[:len(step_cell.params)]))
                params = params[len(step_cell.params):]
                state = {name: (initial[i][slot] if initial[i] is not None else
                                x.new_zeros(batch, step_cell.widths[name]))
                         for i, name in enumerate(step_cell.states)}
                masks = None if drawn is None else CellMasks(
                    drawn[0], slot, mask_rows(steps, batch, lengths, direction == 1))
                ys = [None] * steps
                for t in (reversed(range(steps)) if direction else range(steps)):
                    values = dict(weights, **state)
                    values.update(zip(step_cell.inputs, [x[t]] + [s[t] for s in sides]))
                    new_state, y = step_cell.step(values, masks, t)
                    if valid is not None:
                        new_state = {name: torch.where(valid[t], new_state[name], state[name])
                                     for name in state}
                        y = y * valid[t]
                    state, ys[t] = new_state, y
                outputs.append(torch.stack(ys))
                for i, name in enumerate(step_cell.states):
                    finals[i].append(state[name])
            x = torch.cat(outputs, -1)
            if drawn is not None and drawn[1] > 0 and layer + 1 < num_layers:
                x = between_layers(x, layer, drawn[1], drawn[0], batch_first=False)
        y = x.transpose(0, 1) if batch_first else x
        return y, [torch.stack(slots) for slots in finals]

    return forward
