#!/usr/bin/env python3
"""Writes a data set for examples/array_classifier.sluice: a safetensors file of named arrays.

    python3 examples/classifier_data.py /tmp/blobs.safetensors [--examples N] [--seed S]
    sluice train --program examples/array_classifier.sluice --data /tmp/blobs.safetensors

The file holds "features" f32[N, 8], each feature uniform in [-1, 1), and "label" i64[N], the class
of each example in [0, 4): (x0 + x1 > 0) + 2 * (x2 - x3 > 0), a function of the features that a
classifier can learn. The same seed gives the same file. Only the standard library is used (the
safetensors layout is simple: an 8-byte little-endian header length, a JSON header naming each
array's dtype, shape and byte range, then the arrays' bytes back to back, row-major).
"""

import argparse
import json
import os
import random
import struct

FEATURES = 8


def label_of(x):
    return int(x[0] + x[1] > 0) + 2 * int(x[2] - x[3] > 0)


def safetensors_bytes(arrays):
    """arrays: name -> (dtype, shape, bytes), as safetensors writes them in name order."""
    header, offset = {}, 0
    for name in sorted(arrays):
        dtype, shape, data = arrays[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data buffer starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(arrays[n][2] for n in sorted(arrays))


def write_safetensors(path, arrays):
    """Writes arrays (as safetensors_bytes takes them) to path whole or not at all: a temporary
    file beside it, renamed over it once written."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(safetensors_bytes(arrays))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .safetensors file to write")
    parser.add_argument("--examples", type=int, default=1024, help="N, at least 2")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.examples < 2:
        parser.error("--examples must be at least 2 (sluice holds some out for validation)")
    rng = random.Random(args.seed)
    features, labels = [], []
    for _ in range(args.examples):
        # Rounded to f32 first, so that each label is a function of the features as stored.
        x = struct.unpack(f"<{FEATURES}f", struct.pack(f"<{FEATURES}f",
                                                       *(rng.uniform(-1, 1) for _ in range(FEATURES))))
        features.extend(x)
        labels.append(label_of(x))
    n = args.examples
    write_safetensors(args.out, {
        "features": ("F32", [n, FEATURES], struct.pack(f"<{n * FEATURES}f", *features)),
        "label": ("I64", [n], struct.pack(f"<{n}q", *labels)),
    })
    print(f"wrote {args.out}: features f32[{n}, {FEATURES}], label i64[{n}] in 4 classes")


if __name__ == "__main__":
    main()
