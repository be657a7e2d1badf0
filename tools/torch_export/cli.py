"""export(): trace twice, lower, generalise, write model.sluice and init.safetensors into a fresh
folder renamed to DIR at the end; main(): the command line."""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

import torch

from .errors import AmbiguousSizes, ExportError
from .lowering import Lowering
from .sizes import generalise, second_sizes
from .tracing import (block_paths, check_modules, frozen_parameters, load_module,
                      parameter_aliases, trace)


def write_safetensors(path, tensors):
    """A safetensors file: u64 header length, JSON header, raw little-endian data."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        code = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}[t.dtype]
        raw = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def check_out(out):
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out} is an existing file: give a new or empty folder")
    if os.path.isdir(out) and os.listdir(out):
        raise ExportError(f"--out {out} is a folder that holds other files: give a new or empty "
                          f"folder")


MAX_BATCH = 16384  # --batch of sluice train
MAX_SEQ = 16384    # --seq of sluice train


def export(spec, batch, seq, out):
    # sluice's own bounds (step/config_checks.h): the module is traced for real at about these
    # sizes, so a size typed by mistake would run out of memory or time rather than fail.
    if not (1 <= batch <= MAX_BATCH and 3 <= seq <= MAX_SEQ):
        raise ExportError(f"--batch must be 1 to {MAX_BATCH} and --seq 3 to {MAX_SEQ}, got --batch "
                          f"{batch} --seq {seq} (the program trains at any batch, so a small "
                          f"--batch is enough)")
    check_out(out)
    module, user_file = load_module(spec)
    check_modules(module)
    aliases = parameter_aliases(module)
    if not aliases:
        raise ExportError(f"{spec}: every parameter has requires_grad False: nothing to train")
    names = [n for n, _, _ in aliases]
    blocks = block_paths(module)
    # Buffers, and frozen parameters, which PyTorch never trains: constants of the program.
    buffers = {id(b): n for n, b in module.named_buffers()}
    buffers.update(frozen_parameters(module))
    last_error = None
    # Both traces are shorter than --seq: at the full length PyTorch elides a slice of a buffer
    # that takes all of it (`mask[:T, :T]` of a [T, T] mask), and the two texts would differ.
    t1 = seq - 1
    gm, inputs = trace(module, aliases, user_file, batch, t1)
    lowering = Lowering(gm, inputs, names, blocks, buffers)
    text, units = lowering.run()
    for b2, t2 in second_sizes(batch, t1):
        gm2, inputs2 = trace(module, aliases, user_file, b2, t2)
        text2, _ = Lowering(gm2, inputs2, names, blocks, buffers).run()
        try:
            program = generalise(text, (batch, t1), text2, (b2, t2))
            break
        except AmbiguousSizes as e:
            last_error = e
    else:
        raise last_error
    program = (f"# exported by tools/torch_export.py from {spec} (batch {batch}, sequences up to "
               f"{seq}; traced at [{batch}, {t1}] and [{b2}, {t2}])\n" + program)

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
        tensors.update(lowering.constants)
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
    return units, tied, len(names), sum(p.numel() for _, p, _ in aliases), list(lowering.constants)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="torch_export.py",
        description="Export a PyTorch module as a sluice training program (docs/torch-export.md)")
    parser.add_argument("spec", metavar="FILE.py:FACTORY")
    parser.add_argument("--batch", type=int, required=True, help="batch of the example trace")
    parser.add_argument("--seq", type=int, required=True, help="longest sequence T")
    parser.add_argument("--out", required=True, help="new or empty folder to write")
    a = parser.parse_args(argv)
    try:
        units, tied, count, numel, constants = export(a.spec, a.batch, a.seq, a.out)
    except ExportError as e:
        print(f"torch_export: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {os.path.join(a.out, 'model.sluice')} and {os.path.join(a.out, 'init.safetensors')}"
          f" ({count} parameters, {numel} values)")
    print(f"units: {', '.join(units)}")
    if constants:
        print(f"constants (buffers, never trained): {', '.join(constants)}")
    for n, k in tied:
        print(f"tied: {n} is shared by {k} modules (one parameter)")
    print(f"train it: sluice train --program {os.path.join(a.out, 'model.sluice')} "
          f"--init-from {os.path.join(a.out, 'init.safetensors')}")
    return 0

