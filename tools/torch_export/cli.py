"""export(): trace twice, lower, generalise, write model.sluice and init.safetensors into a fresh
folder renamed to DIR at the end; main(): the command line."""
import argparse
import json
import os
import re
import shutil
import struct
import sys
import tempfile

import torch

from .errors import AmbiguousSizes, ExportError
from .lowering import Lowering
from .recurrent import recurrent_layers
from .safetensors_file import write_safetensors
from .sizes import generalise, second_batches, second_sizes
from .tracing import (block_paths, check_modules, forward_arguments, frozen_parameters,
                      load_module, parameter_aliases, remove_dropout, trace)


def check_out(out):
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out} is an existing file: give a new or empty folder")
    if os.path.isdir(out) and os.listdir(out):
        raise ExportError(f"--out {out} is a folder that holds other files: give a new or empty "
                          f"folder")


MAX_BATCH = 16384  # --batch of sluice train
MAX_SEQ = 16384    # --seq of sluice train

_DATA_DTYPES = {"F32": "f32", "I64": "i64"}  # data arrays the exporter binds (PyTorch's dtypes)
_TORCH_DTYPES = {"f32": torch.float32, "i64": torch.int64}
_INPUT_SPEC = re.compile(r"^(\w+)=(\w+)\[([0-9, ]*)\]$")


def read_array_types(path):
    """{name: (dtype code, shape)} of a safetensors file's arrays, from its header alone."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ExportError(f"--data {path}: not a safetensors file (shorter than 8 bytes)")
            (size,) = struct.unpack("<Q", head)
            if size > 100_000_000:
                raise ExportError(f"--data {path}: not a safetensors file (a header of {size} "
                                  f"bytes)")
            header = json.loads(f.read(size))
    except OSError as e:
        raise ExportError(f"--data {path}: cannot read it: {e.strerror or e}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise ExportError(f"--data {path}: not a safetensors file (its header is not JSON: "
                          f"{e})") from e
    if not isinstance(header, dict):
        raise ExportError(f"--data {path}: not a safetensors file (its header is not a JSON "
                          f"object)")
    return {n: (v["dtype"], list(v["shape"])) for n, v in header.items()
            if n != "__metadata__" and isinstance(v, dict) and "dtype" in v and "shape" in v}


def array_inputs(arg_names, data, specs, binds):
    """[(argument, data array, dtype, example shape)] of a module whose forward reads arrays: the
    types from --data's arrays or from --input NAME=TYPE; --bind ARG=ARRAY renames an array."""
    bound = {}
    for b in binds:
        arg, sep, array = b.partition("=")
        if not sep or not arg or not array:
            raise ExportError(f"--bind {b}: expected ARGUMENT=ARRAY, e.g. --bind x=features")
        if arg not in arg_names:
            raise ExportError(f"--bind {b}: forward has no argument '{arg}' (its arguments: "
                              f"{', '.join(arg_names)})")
        bound[arg] = array
    types = {}
    if data is not None:
        arrays = read_array_types(data)
        for arg in arg_names:
            array = bound.get(arg, arg)
            if array not in arrays:
                raise ExportError(f"--data {data} has no array '{array}' for forward argument "
                                  f"'{arg}' (its arrays: {', '.join(sorted(arrays))}); name the "
                                  f"argument so, or give --bind {arg}=ARRAY")
            code, shape = arrays[array]
            if code not in _DATA_DTYPES or not shape:
                raise ExportError(f"--data {data}: array '{array}' is {code}{shape}: forward's "
                                  f"inputs are f32 (features) or i64 (labels, token ids) arrays "
                                  f"with the examples along their first axis")
            types[arg] = (_DATA_DTYPES[code], shape[1:])
    for spec in specs:
        m = _INPUT_SPEC.match(spec.replace(" ", ""))
        if m is None or m.group(2) not in _TORCH_DTYPES:
            raise ExportError(f"--input {spec}: expected ARGUMENT=TYPE with the type of one "
                              f"example, f32 or i64, e.g. --input 'x=f32[8]' --input 'y=i64[]'")
        arg = m.group(1)
        if arg not in arg_names:
            raise ExportError(f"--input {spec}: forward has no argument '{arg}' (its arguments: "
                              f"{', '.join(arg_names)})")
        types[arg] = (m.group(2), [int(d) for d in m.group(3).split(",") if d])
    missing = [a for a in arg_names if a not in types]
    if missing:
        raise ExportError(f"no type for forward argument(s) {', '.join(missing)}: give "
                          f"--input '{missing[0]}=f32[...]' or an array of that name in --data")
    return [(a, bound.get(a, a), *types[a]) for a in arg_names]


def array_examples(inputs, batch):
    """Example values of array inputs at `batch`: floats normal, integers 0 or 1 (a valid class
    or token id of any model), from a fixed seed."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _, _, dtype, shape in inputs:
        if dtype == "f32":
            out.append(torch.randn([batch] + shape, generator=gen))
        else:
            out.append(torch.randint(0, 2, [batch] + shape, generator=gen))
    return out


def token_examples(batch, seq):
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 2, (batch, seq), generator=gen)
    targets = torch.randint(0, 2, (batch, seq), generator=gen)
    return [tokens, targets]


def export(spec, batch, seq, out, data=None, input_specs=(), binds=(), without_dropout=False):
    """Token mode (no data nor input_specs): forward(tokens, targets) on token data, sizes B and T.
    Array mode: forward's arguments bound to the arrays of a data file, sizes B alone."""
    arrays = data is not None or bool(input_specs)
    # sluice's own bounds (step/config_checks.h): the module is traced for real at about these
    # sizes, so a size typed by mistake would run out of memory or time rather than fail.
    if arrays and seq is not None:
        raise ExportError("--seq is for token models (forward(tokens, targets)); a module whose "
                          "forward reads arrays (--data, --input) takes their shapes from them")
    if not arrays and seq is None:
        raise ExportError("give --seq T for a token model (forward(tokens, targets)), or --data "
                          "FILE.safetensors / --input NAME=TYPE for a module reading arrays")
    if not (1 <= batch <= MAX_BATCH and (arrays or 3 <= seq <= MAX_SEQ)):
        raise ExportError(f"--batch must be 1 to {MAX_BATCH} and --seq 3 to {MAX_SEQ}, got --batch "
                          f"{batch} --seq {seq} (the program trains at any batch, so a small "
                          f"--batch is enough)")
    if data is not None and input_specs:
        raise ExportError("give --data or --input, not both")
    check_out(out)
    module, user_file = load_module(spec)
    check_modules(module)
    dropped = remove_dropout(module) if without_dropout else []
    arg_names = forward_arguments(module)
    recurrent = [path for path, _ in recurrent_layers(module)]
    if arrays:
        inputs = array_inputs(arg_names, data, input_specs, binds)
        data_inputs = [(a, array) for a, array, _, _ in inputs]
        names_of_sizes = ("B",)
        first = (batch,)
        again = second_batches(batch)
        examples = lambda sizes: array_examples(inputs, sizes[0])  # noqa: E731
    else:
        if binds:
            raise ExportError("--bind renames the arrays of --data or --input")
        if len(arg_names) != 2:
            raise ExportError(f"{type(module).__name__}.forward({', '.join(arg_names)}) takes "
                              f"{len(arg_names)} argument(s): a token model is forward(tokens, "
                              f"targets) (int64 [B, T] each); a module reading other arrays needs "
                              f"--data FILE.safetensors or --input NAME=TYPE")
        data_inputs = [("tokens", "tokens"), ("targets", "next_tokens")]
        if recurrent:
            # An unrolled recurrence has one step per position: the program is for T = --seq
            # exactly, and only B is a size.
            names_of_sizes = ("B",)
            first = (batch,)
            again = second_batches(batch)
            examples = lambda sizes: token_examples(sizes[0], seq)  # noqa: E731
        else:
            names_of_sizes = ("B", "T")
            # Both traces are shorter than --seq: at the full length PyTorch elides a slice of a
            # buffer that takes all of it (`mask[:T, :T]` of a [T, T] mask), and the two texts
            # would differ.
            first = (batch, seq - 1)
            again = second_sizes(batch, seq - 1)
            examples = lambda sizes: token_examples(*sizes)  # noqa: E731
    aliases = parameter_aliases(module)
    if not aliases:
        raise ExportError(f"{spec}: every parameter has requires_grad False: nothing to train")
    names = [n for n, _, _ in aliases]
    blocks = block_paths(module)
    # Buffers, and frozen parameters, which PyTorch never trains: constants of the program.
    buffers = {id(b): n for n, b in module.named_buffers()}
    buffers.update(frozen_parameters(module))
    # Tracing runs forward for real, and a batch norm in training mode moves its running
    # statistics (and counts num_batches_tracked) in place: the buffers as the factory made them
    # are what the program starts from, and the module is left as it was.
    initial = {n: b.detach().clone() for n, b in module.named_buffers()}
    last_error = None

    def lower(sizes):
        try:
            gm, values = trace(module, aliases, user_file, examples(sizes), arg_names)
            lowering = Lowering(gm, values, names, blocks, buffers, data_inputs)
            return lowering, lowering.run()[0]
        finally:
            with torch.no_grad():
                for n, b in module.named_buffers():
                    b.copy_(initial[n])

    lowering, text = lower(first)
    units = list(dict.fromkeys(u for u, _ in lowering.lines))
    for second in again:
        _, text2 = lower(second)
        try:
            program = generalise(text, first, text2, second, names_of_sizes)
            break
        except AmbiguousSizes as e:
            last_error = e
    else:
        raise last_error
    at = " and ".join("[" + ", ".join(map(str, s)) + "]" for s in (first, second))
    if arrays:
        what = ", ".join(f"{a} {dt}[B{''.join(f', {d}' for d in shape)}] = {array}"
                         for a, array, dt, shape in inputs)
        program = f"# exported by tools/torch_export.py from {spec} ({what}; traced at {at})\n" + program
    elif recurrent:
        program = (f"# exported by tools/torch_export.py from {spec} (batch {batch}, sequences of "
                   f"{seq} exactly: {', '.join(recurrent)} unrolled over them; traced at {at})\n"
                   + program)
    else:
        program = (f"# exported by tools/torch_export.py from {spec} (batch {batch}, sequences up "
                   f"to {seq}; traced at {at})\n" + program)
    if dropped:
        program = (f"# without dropout (--without-dropout): "
                   f"{', '.join(f'{p} p={v:g}' for p, v in dropped)}\n" + program)

    parent = os.path.dirname(os.path.abspath(out)) or "."
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".torch_export.", dir=parent)
    except OSError as e:
        raise ExportError(f"--out {out}: cannot create a folder in '{parent}': "
                          f"{e.strerror or e}") from e
    try:
        with open(os.path.join(tmp, "model.sluice"), "w") as f:
            f.write(program)
        tensors = {n: p for n, p, _ in aliases}
        tensors.update({n: initial.get(n, t) for n, t in lowering.constants.items()})
        write_safetensors(os.path.join(tmp, "init.safetensors"), tensors)
        if os.path.isdir(out):
            os.rmdir(out)  # empty, checked above
        os.rename(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"--out {out}: cannot write it: {e.strerror or e}") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tied = [(n, len(hs)) for n, _, hs in aliases if len(hs) > 1]
    kinds = {path: f"torch.nn.{type(sub).__name__}" for path, sub in recurrent_layers(module)}
    unrolled = [(path, kinds[path], steps) for path, steps in lowering.gm.unrolled_steps.items()]
    return (units, tied, len(names), sum(p.numel() for _, p, _ in aliases),
            list(lowering.constants), dropped, unrolled)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="torch_export.py",
        description="Export a PyTorch module as a sluice training program (docs/torch-export.md)")
    parser.add_argument("spec", metavar="FILE.py:FACTORY")
    parser.add_argument("--batch", type=int, required=True, help="batch of the example trace")
    parser.add_argument("--seq", type=int, help="longest sequence T (a token model)")
    parser.add_argument("--data", metavar="FILE.safetensors",
                        help="the data file: each forward argument reads the array of its name")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=TYPE",
                        help="the type of one example of forward argument NAME, f32 or i64: "
                             "'x=f32[8]', 'y=i64[]' (instead of --data)")
    parser.add_argument("--bind", action="append", default=[], metavar="ARG=ARRAY",
                        help="forward argument ARG reads the data array ARRAY")
    parser.add_argument("--out", required=True, help="new or empty folder to write")
    parser.add_argument("--without-dropout", action="store_true",
                        help="export every nn.Dropout (and nn.MultiheadAttention's dropout) as p=0: "
                             "the program trains without them, as the module would at p=0 (by "
                             "default each becomes a sluice dropout, as module.train() runs it)")
    a = parser.parse_args(argv)
    try:
        units, tied, count, numel, constants, dropped, unrolled = export(
            a.spec, a.batch, a.seq, a.out, a.data, a.input, a.bind, a.without_dropout)
    except ExportError as e:
        print(f"torch_export: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {os.path.join(a.out, 'model.sluice')} and {os.path.join(a.out, 'init.safetensors')}"
          f" ({count} parameters, {numel} values)")
    print(f"units: {', '.join(units)}")
    if constants:
        print(f"constants and buffers (never trained): {', '.join(constants)}")
    for n, k in tied:
        print(f"tied: {n} is shared by {k} modules (one parameter)")
    for path, kind, steps in unrolled:
        print(f"unrolled: {path} ({kind}) over {steps} steps: the program trains on sequences of "
              f"exactly {steps}")
    if dropped:
        print(f"without dropout: {', '.join(f'{p} (p={v:g})' for p, v in dropped)}: the program "
              f"trains as the module would with these at p=0, not as PyTorch trains it")
    data = f" --data {a.data}" if a.data else (" --data FILE.safetensors" if a.input else "")
    print(f"train it: sluice train --program {os.path.join(a.out, 'model.sluice')} "
          f"--init-from {os.path.join(a.out, 'init.safetensors')}{data}")
    return 0

