"""Sets of time as sorted, disjoint intervals: union, difference, and the time inside a window."""

import bisect

__all__ = ['Intervals', 'union']


class Intervals:
    """Disjoint sorted intervals ``[start, end)`` with prefix sums, for fast measures in windows."""

    __slots__ = ('starts', 'ends', '_cum')

    def __init__(self, pairs=()):
        self.starts = [a for a, _ in pairs]
        self.ends = [b for _, b in pairs]
        cum, total = [0.0], 0.0
        for a, b in pairs:
            total += b - a
            cum.append(total)
        self._cum = cum

    def pairs(self):
        """Return the intervals as a list of ``(start, end)``."""
        return list(zip(self.starts, self.ends))

    def __or__(self, other):
        return union(self.pairs() + other.pairs())

    def __sub__(self, other):
        """Return the time in ``self`` that is not in ``other``."""
        out, j, o_s, o_e = [], 0, other.starts, other.ends
        for a, b in zip(self.starts, self.ends):
            while j < len(o_e) and o_e[j] <= a:
                j += 1
            k = j
            while a < b and k < len(o_s) and o_s[k] < b:
                if o_s[k] > a:
                    out.append((a, o_s[k]))
                a = max(a, o_e[k])
                k += 1
            if a < b:
                out.append((a, b))
        return Intervals(out)

    def measure(self, lo=None, hi=None):
        """Return the total length inside ``[lo, hi)`` (the whole set when both are None)."""
        if lo is None and hi is None:
            return self._cum[-1]
        i = bisect.bisect_right(self.ends, lo)
        j = bisect.bisect_left(self.starts, hi)
        if i >= j:
            return 0.0
        total = self._cum[j] - self._cum[i]
        total -= max(0.0, lo - self.starts[i])
        total -= max(0.0, self.ends[j - 1] - hi)
        return total


def union(pairs):
    """Return the Intervals covering every ``(start, end)`` in ``pairs`` (empty ones dropped)."""
    merged = []
    for a, b in sorted(p for p in pairs if p[1] > p[0]):
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1][1] = b
        else:
            merged.append([a, b])
    return Intervals([(a, b) for a, b in merged])
