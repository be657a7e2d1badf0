#!/usr/bin/env python3
"""Writes a data set of small images for a convolutional classifier: a safetensors file of arrays.

    python3 examples/bars_data.py /tmp/bars.safetensors [--examples N] [--size S] [--seed S]

The file holds "image" f32[N, 1, S, S] (S = 12 by default) and "label" i64[N]: each image is a bar
two pixels wide and 3 to S pixels long at a random place, horizontal (label 0) or vertical
(label 1), of brightness 0.5 to 1, on noise uniform in [0, 0.2). The same seed gives the same file.
Only the standard library is used (examples/classifier_data.py describes the file layout).
tests/parity/torch_classifiers.py's `cnn` classifies these; docs/torch-export.md exports it.
"""

import argparse
import random
import struct

from classifier_data import write_safetensors  # the same directory


def bar_image(rng, size):
    """One image (row-major, size × size) and its label: 0 horizontal, 1 vertical."""
    pixels = [rng.uniform(0, 0.2) for _ in range(size * size)]
    label = rng.randrange(2)
    length = rng.randint(3, size)
    along, across = rng.randrange(size - length + 1), rng.randrange(size - 1)
    brightness = rng.uniform(0.5, 1.0)
    for k in range(length):
        for w in range(2):
            r, c = (across + w, along + k) if label == 0 else (along + k, across + w)
            pixels[r * size + c] += brightness
    return pixels, label


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .safetensors file to write")
    parser.add_argument("--examples", type=int, default=512, help="N, at least 2")
    parser.add_argument("--size", type=int, default=12, help="S, the images' side, at least 4")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.examples < 2:
        parser.error("--examples must be at least 2 (sluice holds some out for validation)")
    if args.size < 4:
        parser.error("--size must be at least 4")
    rng = random.Random(args.seed)
    images, labels = [], []
    for _ in range(args.examples):
        pixels, label = bar_image(rng, args.size)
        images.extend(pixels)
        labels.append(label)
    n, s = args.examples, args.size
    write_safetensors(args.out, {
        "image": ("F32", [n, 1, s, s], struct.pack(f"<{n * s * s}f", *images)),
        "label": ("I64", [n], struct.pack(f"<{n}q", *labels)),
    })
    print(f"wrote {args.out}: image f32[{n}, 1, {s}, {s}], label i64[{n}] in 2 classes")


if __name__ == "__main__":
    main()
