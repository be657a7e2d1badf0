#!/usr/bin/env python3
"""Writes a data set of padded token sequences for a text classifier: a safetensors file of arrays.

    python3 examples/padded_text_data.py /tmp/text.safetensors [--examples N] [--seq T] [--seed S]

The file holds "tokens" i64[N, T] (T = 12 by default), "mask" i64[N, T] and "label" i64[N]: each
sequence has 3 to T tokens drawn from 1 to 10, then the padding id 0 to length T; mask is 1 at a
token and 0 at the padding (as a tokenizer's attention_mask); the label is 1 when the sequence
holds more 1s and 3s than 2s and 4s, else 0. The same seed gives the same file. Only the standard
library is used (examples/classifier_data.py describes the file layout).
tests/parity/torch_classifiers.py's `bert_classifier` and `encoder_classifier` classify these,
reading the mask as a padding mask.
"""

import argparse
import random
import struct

from classifier_data import write_safetensors  # the same directory


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .safetensors file to write")
    parser.add_argument("--examples", type=int, default=512, help="N, at least 2")
    parser.add_argument("--seq", type=int, default=12, help="T, the padded length, at least 3")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.examples < 2:
        parser.error("--examples must be at least 2 (sluice holds some out for validation)")
    if args.seq < 3:
        parser.error("--seq must be at least 3")
    rng = random.Random(args.seed)
    n, t = args.examples, args.seq
    tokens, mask, labels = [], [], []
    for _ in range(n):
        length = rng.randint(3, t)
        row = [rng.randint(1, 10) for _ in range(length)]
        labels.append(int(row.count(1) + row.count(3) > row.count(2) + row.count(4)))
        tokens.extend(row + [0] * (t - length))
        mask.extend([1] * length + [0] * (t - length))
    write_safetensors(args.out, {
        "tokens": ("I64", [n, t], struct.pack(f"<{n * t}q", *tokens)),
        "mask": ("I64", [n, t], struct.pack(f"<{n * t}q", *mask)),
        "label": ("I64", [n], struct.pack(f"<{n}q", *labels)),
    })
    print(f"wrote {args.out}: tokens i64[{n}, {t}], mask i64[{n}, {t}], label i64[{n}] "
          f"in 2 classes")


if __name__ == "__main__":
    main()
