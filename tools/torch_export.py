#!/usr/bin/python3
"""Export a PyTorch nn.Module as a sluice training program and its initial weights.

Usage: /usr/bin/python3 tools/torch_export.py FILE.py:FACTORY --batch B --seq T --out DIR
       /usr/bin/python3 tools/torch_export.py FILE.py:FACTORY --batch B --data FILE.safetensors
           --out DIR    (a forward reading arrays: each argument binds the array of its name;
                         --input 'x=f32[8]' gives a type instead, --bind x=features another name)

Imports FILE.py, calls FACTORY() for the module, whose forward(tokens, targets) (int64 [B, T] each)
returns the mean next-token cross-entropy, and writes
  DIR/model.sluice      the forward pass and loss as a program `sluice train --program` trains:
                        inputs %tokens (= tokens) and %targets (= next_tokens), one `param` per
                        named_parameters() entry (`= loaded`, PyTorch layout), units from the
                        module tree, batch and sequence sizes written B and T;
  DIR/init.safetensors  the module's parameters under their named_parameters() names.

How (docs/torch-export.md has the op table and the limits):
  1. Trace: make_fx over a call of the module whose parameters are swapped for placeholders (every
     alias of a tied Parameter gets the same one), at (B, T) and again at smaller sizes. Forward
     hooks record which module each ATen node comes from and the user's source line.
  2. Map: each ATen node becomes sluice instructions (Lowering). Values that depend on no input or
     parameter (arange, masks, index arithmetic) are folded to constants; a constant causal mask
     becomes causal_mask. A transpose feeding a matmul becomes its transpose_a/transpose_b.
  3. Generalise: every integer that differs between the two texts is written as a product of B and
     T and a factor that gives both (as sluice's GeneraliseSizes does for `sluice export`).
  4. Write both files into a fresh folder beside DIR and rename it to DIR: nothing half-written.

Only the standard library and torch (Debian's python3-torch, PyTorch 1.13) are used.
"""
import os
import sys

# The package tools/torch_export/ holds the exporter (tracing, op mapping, printing); this file is
# the fixed command line. A folder wins over a module of the same name on sys.path, so this imports
# the package, not this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_export.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
