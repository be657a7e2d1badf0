"""tools/torch_export.py as a package: a PyTorch nn.Module as a sluice training program.

  errors.py    ExportError: a problem with the user's module or arguments (exit 1, nothing written)
  tracing.py   loading FILE.py:FACTORY, parameter aliases (tied weights), units from the module
               tree, make_fx tracing with the module path and source line of every node
  values.py    what a graph node lowers to (Val, Transposed, Const) and how the text writes it
  lowering.py  one traced graph -> program text: folding, buffers as constants, units, RMS norm
               fusion
  ops.py       the op mapping: one handler per ATen op (docs/torch-export.md has the table)
  sizes.py     two traces -> sizes written as B and T
  safetensors_file.py  read_safetensors, write_safetensors (also the parity tests' PyTorch side)
  cli.py       export() (trace twice, generalise, write both files atomically) and main()

The command line is fixed: /usr/bin/python3 tools/torch_export.py FILE.py:FACTORY --batch B
--seq T --out DIR for a token model, or --batch B --data FILE.safetensors --out DIR for a module
whose forward reads arrays (tools/torch_export.py runs cli.main). Only the standard library and torch
(Debian's python3-torch, PyTorch 1.13) are used.
"""
