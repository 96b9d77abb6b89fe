"""The compiled programs rnnc.nn's modules keep between calls, while their parameters keep their
values, and the calls that build and run them."""

import torch

from . import _rnnc


WEIGHTS_DTYPES = ("fp32", "bf16", "fp16", "int8")


def rnnc_options(jit, threads, target_cpu, weights_dtype):
    """rnnc's options of a torch module (those of rnnc.Layer), checked."""
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"weights_dtype must be one of {', '.join(WEIGHTS_DTYPES)}, not "
                         f"{weights_dtype!r}")
    return dict(jit=bool(jit), threads=int(threads), target_cpu=str(target_cpu),
                weights_dtype=weights_dtype)


def weights_dtype(module):
    """The weights_dtype a call runs: the module's option (fp32 in a module pickled, or a spec
    traced, before it had one), but bf16 for an fp32 module under torch.autocast("cpu",
    torch.bfloat16), as torch's autocast runs its own products there (mixed precision: the
    products' operands rounded to bf16, the rest fp32; torch.autocast(enabled=False) inside
    keeps fp32)."""
    dtype = module._rnnc_options.get("weights_dtype", "fp32")
    if (dtype == "fp32" and torch.is_autocast_cpu_enabled()
            and torch.get_autocast_cpu_dtype() == torch.bfloat16):
        return "bf16"
    return dtype


class _ProgramCache:
    """A module's program kept between calls while its parameters keep their values: the
    inference program (rnnc's Layer: no tape, weights packed once) for calls that autograd does
    not record, such as evaluation under torch.no_grad() (the training forward builds a program
    and packs the weights at every call: a batch-1 LSTM, I=H=512, 8.5 ms a call, against 5.9
    with this program); and the training program, which a loop stepping a cell calls many times
    between optimiser steps. It is kept while the parameters equal the weights it was built
    from, bit for bit, which the program checks against its own copies (same_weights): torch's
    version counter misses writes through ``p.data`` (hand-written optimisers, EMA updates), so
    the check compares the values, a read of the weights once a call (memcmp: about 0.2 ms for
    the 8 MB of that LSTM), and no copy of them is kept besides the program's."""

    attributes = ("_rnnc_inference", "_rnnc_training")

    def __init__(self, attribute):
        assert attribute in self.attributes
        self._attribute = attribute

    def get(self, module, names, params, build, key=None):
        """The program for `params` (float32 tensors, by `names`) and `key` (whatever else the
        program is built with: the training flag, a dropout's seed); build(weights) makes one
        from numpy arrays (which it copies)."""
        key = (key, weights_dtype(module))  # (the option may change between calls)
        weights = dict(zip(names, (_array(p) for p in params)))
        cached = module.__dict__.get(self._attribute)
        if cached is not None and cached[0] == key and cached[1].same_weights(weights):
            return cached[1]
        # The program replaced goes first (no reference to it left here), so that its buffers
        # serve its successor (its code stays in the memory cache, runtime/exec/CompiledCell.cpp);
        # a failed build keeps none.
        cached = None
        module.__dict__.pop(self._attribute, None)
        program = build([weights[name] for name in names])
        module.__dict__[self._attribute] = (key, program)
        return program

    @classmethod
    def without(cls, state):
        """A module's pickled state without its programs (copies build their own) and the
        gradient sums of its calls (rnnc/_autograd.py's summed_parameters)."""
        state = dict(state)
        for attribute in cls.attributes + ("_rnnc_sums",):
            state.pop(attribute, None)
        return state


def _array(param):
    """A float32 parameter's values as a C-ordered numpy array (its own memory where it can)."""
    return param.detach().cpu().contiguous().numpy()


_inference_programs = _ProgramCache("_rnnc_inference")
_training_programs = _ProgramCache("_rnnc_training")


def _infer(layer, x, state_names, states, lengths, sides=None):
    """y and the final states by the inference program, as torch tensors."""
    given = {name: t.detach().contiguous().numpy()
             for name, t in zip(state_names, states) if t is not None}
    sides = {name: t.detach().contiguous().numpy() for name, t in (sides or {}).items()}
    y, finals = layer.forward(x.detach().contiguous().numpy(), given, lengths, sides)
    return torch.from_numpy(y), [torch.from_numpy(finals[name]) for name in state_names]


def _program(make, module, cell, weights, sizes, *training_args, layout=None,
             **training_options):
    """rnnc's inference Layer (make=_rnnc.Layer) or Training program for one of these modules:
    the cell, numpy weights and sizes given, the options the module's, and its layout
    (num_layers, bidirectional, batch_first) unless given (a cell's: one step of one layer)."""
    layout = layout or (module.num_layers, module.bidirectional, module.batch_first)
    dtype = weights_dtype(module)
    if make is _rnnc.Training and dtype == "int8":
        raise NotImplementedError(
            "weights_dtype='int8' runs inference only, and autograd records this call (grad mode "
            "is on and a parameter or an input requires grad): train in fp32, or in mixed "
            "precision with weights_dtype='bf16' or 'fp16', then run the trained module as int8 "
            "under torch.no_grad() or torch.inference_mode()")
    return make(cell, weights, sizes, *layout, module._rnnc_options["jit"],
                module._rnnc_options["threads"], module._rnnc_options["target_cpu"],
                *training_args, **training_options, weights_dtype=dtype)
