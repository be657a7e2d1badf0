#!/usr/bin/env python3
"""Fails when a layer of sluice includes a layer it must not see.

    scripts/check-includes.py [ROOT]         check ROOT/src/sluice (ROOT: this checkout by default)
    scripts/check-includes.py --docs [ROOT]  ... and that ROOT/docs draws the same layers
    scripts/check-includes.py --table        print the table of allowed includes and exit
    scripts/check-includes.py --markdown     print it as docs/development.md shows it, and exit

The table is src/sluice/layers.txt (CMake links each layer's library from the same rows). Every
file under ROOT/src/sluice/<layer>/ (any depth) is read for lines `#include "sluice/<other>/..."`;
each include of a layer that <layer>'s row does not list is printed as

    src/sluice/<layer>/file.h:LINE: <layer> includes <other> (sluice/<other>/header.h)

A folder of src/sluice that is not in the table, or an include of one, is reported too, so that a
new layer is placed in the table before it is used. Only the quoted or bracketed `sluice/<layer>/`
form is read: sluice includes its own headers by that path everywhere.

With --docs, the docs must say what the table says: docs/development.md holds the table exactly as
--markdown prints it, between the lines LAYER_TABLE_BEGIN and LAYER_TABLE_END below, and the figure
of docs/architecture.md (its first ``` block: a line per layer, `<layer>/` at its start, top layer
first) draws every layer of the table, each above every layer it includes.

Exit status: 0 when every include is allowed (and the docs agree), 1 when not, 2 for bad usage
(ROOT has no src/sluice). Python 3 standard library only.
"""

import argparse
import re
import sys
from pathlib import Path

# The table: src/sluice/layers.txt of this checkout, the one statement of the layer rule (CMake
# links each layer's library from the same rows). A row is `<layer>: <layers> | <libraries>`.
LAYER_TABLE = Path(__file__).resolve().parent.parent / "src" / "sluice" / "layers.txt"


def read_table(path=LAYER_TABLE):
    """{layer: [layers it may include]}, lowest layer first, from the rows of `path`."""
    table = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(r"([a-z_]+):([^|]*)(\|.*)?", line.strip())
        if match is None:
            sys.exit(f"{path}:{number}: cannot read the row (<layer>: <layers> | <libraries>)")
        table[match.group(1)] = match.group(2).split()
    return table


ALLOWED = read_table()

SOURCE_SUFFIXES = {".h", ".hpp", ".inc", ".cc", ".cpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](sluice/([^/">]+)/[^">]*)[">]')


def check_table():
    """The table must only let a layer see layers below it (listed before it)."""
    order = list(ALLOWED)
    for layer, allowed in ALLOWED.items():
        for other in allowed:
            assert other in ALLOWED and order.index(other) < order.index(layer), (
                f"{LAYER_TABLE}: {layer} may include {other}, which is not a layer below it")


def violations(root):
    """Yields one message per include that the table forbids, in path and line order."""
    base = root / "src" / "sluice"
    for layer_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        layer = layer_dir.name
        if layer not in ALLOWED:
            yield (f"{layer_dir.relative_to(root)}: {layer} is not a layer in the table of "
                   f"src/sluice/layers.txt (add it, in its place in the stack)")
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


LAYER_TABLE_BEGIN = "<!-- layer table: scripts/check-includes.py --markdown prints it -->"
LAYER_TABLE_END = "<!-- end of layer table -->"


def markdown_table():
    rows = ["| layer | may include |", "|---|---|"]
    for layer, allowed in reversed(ALLOWED.items()):
        rows.append(f"| `{layer}/` | {', '.join(allowed) or 'nothing'} |")
    return "\n".join(rows)


def doc_violations(root):
    """Yields one message per place where docs/development.md or docs/architecture.md disagrees
    with the table."""
    development = root / "docs" / "development.md"
    text = development.read_text(encoding="utf-8") if development.is_file() else ""
    begin, end = text.find(LAYER_TABLE_BEGIN), text.find(LAYER_TABLE_END)
    if begin < 0 or end < begin:
        yield (f"{development.relative_to(root)}: no layer table between "
               f"'{LAYER_TABLE_BEGIN}' and '{LAYER_TABLE_END}'")
    elif text[begin + len(LAYER_TABLE_BEGIN):end].strip() != markdown_table():
        line = text.count("\n", 0, begin) + 1
        yield (f"{development.relative_to(root)}:{line}: the layer table differs from "
               f"src/sluice/layers.txt (paste `scripts/check-includes.py --markdown` there)")

    architecture = root / "docs" / "architecture.md"
    lines = architecture.read_text(encoding="utf-8").splitlines() if architecture.is_file() else []
    name = architecture.relative_to(root)
    fences = [number for number, line in enumerate(lines) if line.startswith("```")]
    if len(fences) < 2:
        yield f"{name}: no figure of the layers (a ``` block)"
        return
    drawn = {}  # layer -> (position from the top, line number)
    for number in range(fences[0] + 1, fences[1]):
        match = re.match(r"([a-z_]+)/(\s|$)", lines[number])
        if match:
            drawn[match.group(1)] = (len(drawn), number + 1)
    for layer in ALLOWED:
        if layer not in drawn:
            yield f"{name}:{fences[0] + 1}: the figure has no {layer}/, a layer of the table"
    for layer, (position, number) in drawn.items():
        if layer not in ALLOWED:
            yield f"{name}:{number}: the figure draws {layer}/, which is not a layer of the table"
            continue
        for other in ALLOWED[layer]:
            if other in drawn and drawn[other][0] < position:
                yield (f"{name}:{number}: the figure draws {layer}/ below {other}/, "
                       f"which it includes")


def main():
    parser = argparse.ArgumentParser(
        description="Fails when a layer of src/sluice includes a layer it must not see.")
    parser.add_argument("root", nargs="?", type=Path,
                        default=Path(__file__).resolve().parent.parent,
                        help="the directory holding src/sluice (default: this checkout)")
    parser.add_argument("--table", action="store_true",
                        help="print which layers each layer may include, and exit")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table as docs/development.md shows it, and exit")
    parser.add_argument("--docs", action="store_true",
                        help="check too that ROOT/docs shows the layers of the table")
    args = parser.parse_args()
    check_table()
    if args.table:
        print_table()
        return 0
    if args.markdown:
        print(markdown_table())
        return 0
    root = args.root.resolve()
    if not (root / "src" / "sluice").is_dir():
        print(f"check-includes: {root} has no src/sluice directory", file=sys.stderr)
        return 2
    found = list(violations(root))
    if args.docs:
        found += doc_violations(root)
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
