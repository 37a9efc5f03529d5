"""The categories of an iteration and the statistics the report's parts share (median, 95th percentile)."""

import numpy

__all__ = ['CATEGORIES', 'median', 'p95']

#: The categories of an iteration, in the order that decides which one an instant belongs to.
CATEGORIES = ('compute', 'wait', 'comm', 'io', 'eval', 'data', 'other')


def median(values):
    """Return the median of ``values`` (NaN when empty)."""
    return float(numpy.median(values)) if len(values) else float('nan')


def p95(values):
    """Return the 95th percentile of ``values`` (linear interpolation; NaN when empty)."""
    return float(numpy.percentile(values, 95)) if len(values) else float('nan')
