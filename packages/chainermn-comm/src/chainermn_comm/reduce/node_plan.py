"""The plan of a node-shared average: arrays laid end to end, cut into chunks and one share per rank.

See :mod:`chainermn_comm.reduce.node_shared` (the module doc) for what each rank does with a plan.
"""

__all__ = ['Chunk', 'make_plan']


class Chunk:
    """What one rank does for one chunk: stage, reduce its own share, unpack the others'."""

    __slots__ = ('stage', 'own', 'own_region', 'unpack')

    def __init__(self):
        self.stage = []   # (array index, start, stop, destination view in my segment)
        self.own = []     # (array index, start, stop, accumulator, [view per local rank; None: mine], offset)
        self.own_region = None  # my whole share of this chunk in my segment
        self.unpack = []  # (array index, start, stop, source view in the owner's segment)


def make_plan(sizes, chunk_elems, nlocal, me, segments):
    """Cut arrays of ``sizes`` laid end to end into chunks and shares; see the module doc."""
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    total = starts[-1]
    plan = []
    i = 0
    for k, c0 in enumerate(range(0, total, chunk_elems)):
        c1 = min(c0 + chunk_elems, total)
        n = c1 - c0
        base = (k & 1) * chunk_elems
        # Shares sit at the same place of the segment in every chunk (the last, short chunk
        # only clips them), so staging chunk k+2 never touches a share a peer still reads
        # from chunk k.
        bounds = [c0 + min(n, chunk_elems * j // nlocal) for j in range(nlocal + 1)]
        chunk = Chunk()
        chunk.own_region = segments[me][base + bounds[me] - c0:base + bounds[me + 1] - c0]
        while starts[i + 1] <= c0:
            i += 1
        j = i
        while j < len(sizes) and starts[j] < c1:
            a0, a1 = max(c0, starts[j]), min(c1, starts[j + 1])
            for owner in range(nlocal):
                x0, x1 = max(a0, bounds[owner]), min(a1, bounds[owner + 1])
                if x0 >= x1:
                    continue
                item = (j, x0 - starts[j], x1 - starts[j])
                s0, s1 = base + x0 - c0, base + x1 - c0
                if owner == me:
                    terms = [None if p == me else segments[p][s0:s1] for p in range(nlocal)]
                    chunk.own.append(item + (segments[me][s0:s1], terms, x0 - bounds[me]))
                else:
                    chunk.stage.append(item + (segments[me][s0:s1],))
                    chunk.unpack.append(item + (segments[owner][s0:s1],))
            j += 1
        plan.append(chunk)
    return plan
