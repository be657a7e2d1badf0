"""safetensors files as PyTorch tensors, with the standard library and torch only (no `safetensors`
package): an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape
and byte range (and an optional "__metadata__" of strings), padded with spaces to 8 bytes, then the
raw little-endian data. The one reader and writer of tools/torch_export.py (init.safetensors) and
of the PyTorch references of the parity tests (tests/parity/gpt_reference.py and its users)."""
import json
import os
import struct

import torch

_DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}


def read_safetensors(path):
    """({name: tensor}, {metadata key: value}) of the file at path."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        buf = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"]).clone()
    return tensors, meta


def write_safetensors(path, tensors):
    """Writes {name: tensor} (f32, f64, i64 or i32; any device, layout or autograd state) in the
    dict's order, atomically (a temporary file renamed over `path`)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        array = t.numpy()
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    # A temporary file beside it, flushed and renamed over: a full disk or a signal leaves the old
    # file or none, never a torn one.
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
