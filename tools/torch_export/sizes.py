"""Two traces at different (B, T) to one program whose sizes are written B and T."""
import itertools
import math
import re

from .errors import AmbiguousSizes, ExportError


_INT = re.compile(r"(?<![\w.+\-])-?\d+(?![\w.])")


def size_product(a, b, sizes_a, sizes_b, names=("B", "T")):
    """The product of the sizes (B and T, or B alone; each to the power 0..2) and a factor giving
    a at sizes_a and b at sizes_b; None when none or more than one does."""
    found = set()
    for powers in itertools.product(range(3), repeat=len(names)):
        if not any(powers):
            continue
        ma = math.prod(s ** p for s, p in zip(sizes_a, powers))
        mb = math.prod(s ** p for s, p in zip(sizes_b, powers))
        if a % ma or b % mb or a // ma != b // mb or a // ma <= 0:
            continue
        f = a // ma
        terms = ([] if f == 1 else [str(f)]) + [n for n, p in zip(names, powers) for _ in range(p)]
        found.add("*".join(terms))
    return found.pop() if len(found) == 1 else None


def _at(sizes):
    return "[" + ", ".join(str(s) for s in sizes) + "]"


def generalise(text_a, sizes_a, text_b, sizes_b, names=("B", "T")):
    pieces_a, pieces_b = _INT.split(text_a), _INT.split(text_b)
    ints_a, ints_b = _INT.findall(text_a), _INT.findall(text_b)
    if pieces_a != pieces_b:
        for line_no, (la, lb) in enumerate(zip(text_a.splitlines(), text_b.splitlines()), 1):
            if _INT.split(la) != _INT.split(lb):
                raise ExportError(
                    f"the program differs between {_at(sizes_a)} and {_at(sizes_b)} in more "
                    f"than sizes (data-dependent control flow?), line {line_no}:\n  {la.strip()}\n  {lb.strip()}")
        raise ExportError("the program differs between sizes in its number of lines "
                          "(data-dependent control flow?)")
    out = [pieces_a[0]]
    for ia, ib, piece in zip(ints_a, ints_b, pieces_a[1:]):
        if ia != ib:
            expr = size_product(int(ia), int(ib), sizes_a, sizes_b, names)
            if expr is None:
                line = text_a[:text_a.find(piece)].count("\n") + 1
                raise AmbiguousSizes(f"line {line}: {ia} becomes {ib} at other sizes, which no "
                                     f"single product of {' and '.join(names)} gives (try "
                                     f"another --batch)")
            ia = expr
        out.append(ia)
        out.append(piece)
    return "".join(out)


def second_sizes(batch, seq):
    """Sizes for the second trace: smaller T (a position table may cap it), another B."""
    for b2, t2 in ((batch + 1, seq - 1), (batch + 2, seq - 2), (2 * batch + 1, seq - 3)):
        if t2 >= 1 and b2 * seq != batch * t2:
            yield b2, t2


def second_batches(batch):
    """Batches for the second trace of a model whose inputs have no sequence axis."""
    for b2 in (batch + 1, batch + 2, 2 * batch + 1):
        yield (b2,)
