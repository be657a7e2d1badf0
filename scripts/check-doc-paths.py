#!/usr/bin/env python3
"""Fails when the code or the docs name a sluice file that does not exist.

    scripts/check-doc-paths.py [ROOT]     check ROOT (this checkout by default)

Reads every *.h and *.cc under ROOT/src, every ROOT/docs/*.md and ROOT/README.md for two kinds
of path, and prints each one that names no file as `FILE:LINE: PATH names no file (...)`:

  * a header or source of a layer: `<layer>/<file>.h` or `.cc`, with or without a leading
    `sluice/` or `src/sluice/` (`step/step_engine.h`, `sluice/ir/ops/attention.h`), looked up as
    ROOT/src/sluice/<layer>/<file>; the layers are the rows of src/sluice/layers.txt;
  * a page of the docs: `docs/<name>.md`, looked up as ROOT/docs/<name>.md.

A path that starts inside another one (`tests/pipeline/x.cc`, `bench/core/y.h`) is not read as a
layer's. ALLOW_LIST holds the few paths named on purpose that do not exist (the fixtures' fake
files). Exit status: 0 when every path names a file, 1 when some does not, 2 for bad usage.
Python 3 standard library only.
"""

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
LAYER_TABLE = HERE / "src" / "sluice" / "layers.txt"

# Paths named on purpose that are not files of sluice: the include check's fixture tree
# (tests/tools/fixtures/include_tree), quoted in docs/development.md, and the pattern of a
# command's file in cli/commands.h.
ALLOW_LIST = {
    "cli/foo_command.cc",
    "core/lowest.h",
    "extras/helper.h",
}


def layers():
    names = []
    for line in LAYER_TABLE.read_text(encoding="utf-8").splitlines():
        match = re.match(r"([a-z_]+):", line)
        if match:
            names.append(match.group(1))
    return names


def patterns():
    alternatives = "|".join(layers())
    # Not preceded by a path character: `tests/pipeline/x.cc` is not pipeline/x.cc.
    layer_path = re.compile(r"(?<![\w./-])(?:src/)?(?:sluice/)?((?:" + alternatives +
                            r")/[\w./-]*?\w\.(?:h|cc))(?![\w-])")
    doc_path = re.compile(r"(?<![\w./-])docs/([\w.-]+?\.md)(?![\w-])")
    return layer_path, doc_path


def files_to_read(root):
    for suffix in ("*.h", "*.cc"):
        yield from sorted((root / "src").rglob(suffix))
    yield from sorted((root / "docs").glob("*.md"))
    if (root / "README.md").is_file():
        yield root / "README.md"


def violations(root):
    layer_path, doc_path = patterns()
    for path in files_to_read(root):
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            where = f"{path.relative_to(root)}:{number}"
            for match in layer_path.finditer(line):
                name = match.group(1)
                if name in ALLOW_LIST or (root / "src" / "sluice" / name).is_file():
                    continue
                yield f"{where}: {name} names no file (no src/sluice/{name})"
            for match in doc_path.finditer(line):
                if not (root / "docs" / match.group(1)).is_file():
                    yield f"{where}: docs/{match.group(1)} names no file"


def main():
    parser = argparse.ArgumentParser(
        description="Fails when src/, docs/ or README.md name a sluice file that does not exist.")
    parser.add_argument("root", nargs="?", type=Path, default=HERE,
                        help="the checkout to read (default: this one)")
    root = parser.parse_args().root.resolve()
    if not (root / "src").is_dir() and not (root / "docs").is_dir():
        print(f"check-doc-paths: {root} has neither src/ nor docs/", file=sys.stderr)
        return 2
    found = list(violations(root))
    for message in found:
        print(message)
    if found:
        print(f"check-doc-paths: {len(found)} path(s) name no file", file=sys.stderr)
        return 1
    print(f"check-doc-paths: every path named in {root} src/, docs/ and README.md names a file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
