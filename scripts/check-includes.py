#!/usr/bin/env python3
"""Fails when a layer of sluice includes a layer it must not see.

    scripts/check-includes.py [ROOT]      check ROOT/src/sluice (ROOT: this checkout by default)
    scripts/check-includes.py --table     print the table of allowed includes and exit

Every file under ROOT/src/sluice/<layer>/ (any depth) is read for lines
`#include "sluice/<other>/..."`; each include of a layer that ALLOWED below does not list for
<layer> is printed as

    src/sluice/<layer>/file.h:LINE: <layer> includes <other> (sluice/<other>/header.h)

A folder of src/sluice that is not in the table, or an include of one, is reported too, so that a
new layer is placed in the table before it is used. Only the quoted or bracketed `sluice/<layer>/`
form is read: sluice includes its own headers by that path everywhere. Exit status: 0 when every include is allowed,
1 when some is not, 2 for bad usage (ROOT has no src/sluice). Python 3 standard library only.
"""

import argparse
import re
import sys
from pathlib import Path

# The layers, lowest first, and which other layers each may include. The rule behind the table:
# a layer sees only layers below it (docs/architecture.md draws the stack), with two exceptions
# that keep independent parts independent:
#   * comm/ (the Communicator and its backends) sees only core/: ranks exchange tensors and know
#     nothing of programs, models or training;
#   * train/ and pipeline/ both sit on step/ (TrainConfig, Task, the StepEngine interface and the
#     builder of a stage's programs) and never include each other; only cli/ sees both.
# docs/development.md shows the same table; change both together.
ALLOWED = {
    "core": [],
    "kernels": ["core"],
    "ir": ["core", "kernels"],
    "autodiff": ["core", "kernels", "ir"],
    "exec": ["core", "kernels", "ir", "autodiff"],
    "comm": ["core"],
    "io": ["core", "kernels", "ir", "autodiff", "exec", "comm"],
    "nn": ["core", "kernels", "ir", "autodiff", "exec", "comm", "io"],
    "step": ["core", "kernels", "ir", "autodiff", "exec", "comm", "io", "nn"],
    "train": ["core", "kernels", "ir", "autodiff", "exec", "comm", "io", "nn", "step"],
    "pipeline": ["core", "kernels", "ir", "autodiff", "exec", "comm", "io", "nn", "step"],
    "cli": ["core", "kernels", "ir", "autodiff", "exec", "comm", "io", "nn", "step", "train",
            "pipeline"],
}

SOURCE_SUFFIXES = {".h", ".hpp", ".inc", ".cc", ".cpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](sluice/([^/">]+)/[^">]*)[">]')


def check_table():
    """The table must only let a layer see layers below it (listed before it)."""
    order = list(ALLOWED)
    for layer, allowed in ALLOWED.items():
        for other in allowed:
            assert other in ALLOWED and order.index(other) < order.index(layer), (
                f"ALLOWED: {layer} may include {other}, which is not a layer below it")


def violations(root):
    """Yields one message per include that the table forbids, in path and line order."""
    base = root / "src" / "sluice"
    for layer_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        layer = layer_dir.name
        if layer not in ALLOWED:
            yield (f"{layer_dir.relative_to(root)}: {layer} is not a layer in the table of "
                   f"scripts/check-includes.py (add it, in its place in the stack)")
            continue
        for path in sorted(layer_dir.rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                match = INCLUDE.match(line)
                if match is None:
                    continue
                header, other = match.group(1), match.group(2)
                if other == layer or other in ALLOWED[layer]:
                    continue
                message = f"{path.relative_to(root)}:{number}: {layer} includes {other} ({header})"
                if other not in ALLOWED:
                    message += ", which is not a layer in the table"
                yield message


def print_table():
    width = max(len(layer) for layer in ALLOWED)
    for layer, allowed in reversed(ALLOWED.items()):
        print(f"{layer + '/':<{width + 1}}  may include  {', '.join(allowed) or '(nothing)'}")


def main():
    parser = argparse.ArgumentParser(
        description="Fails when a layer of src/sluice includes a layer it must not see.")
    parser.add_argument("root", nargs="?", type=Path,
                        default=Path(__file__).resolve().parent.parent,
                        help="the directory holding src/sluice (default: this checkout)")
    parser.add_argument("--table", action="store_true",
                        help="print which layers each layer may include, and exit")
    args = parser.parse_args()
    check_table()
    if args.table:
        print_table()
        return 0
    root = args.root.resolve()
    if not (root / "src" / "sluice").is_dir():
        print(f"check-includes: {root} has no src/sluice directory", file=sys.stderr)
        return 2
    found = list(violations(root))
    for message in found:
        print(message)
    if found:
        print(f"check-includes: {len(found)} violation(s) of the layer order; "
              f"`scripts/check-includes.py --table` shows what each layer may include",
              file=sys.stderr)
        return 1
    print(f"check-includes: every include of {root / 'src' / 'sluice'} follows the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
