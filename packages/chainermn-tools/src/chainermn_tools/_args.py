"""Argument types of the tools' command lines: numbers checked against their bounds at parse time.

``argparse`` then names the option and what it takes, e.g. ``argument --probe-timeout: -3 is out
of range: give a number of seconds > 0``, and exits with status 2 before anything starts.
"""

import argparse
import math

__all__ = ['number', 'seconds', 'count']


def number(kind=float, low=None, high=None, low_open=False, off=None, unit=''):
    """Return an argparse ``type`` for a number of ``kind`` within [low, high] (``low_open``: > low).

    ``off``: a value accepted outside the range (e.g. 0 for 'off'); ``unit`` is named in errors.
    """
    what = 'an integer' if kind is int else 'a number'
    if unit:
        what += ' of ' + unit
    parts = []
    if low is not None:
        parts.append('{} {:g}'.format('>' if low_open else '>=', low))
    if high is not None:
        parts.append('<= {:g}'.format(high))
    takes = what + (' ' + ' and '.join(parts) if parts else '')
    if off is not None:
        takes += ', or {:g} for off'.format(off)

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError('{!r} is not {}: give {}'.format(text, what, takes))
        if off is not None and value == off:
            return value
        bad = isinstance(value, float) and not math.isfinite(value)
        if low is not None and (value <= low if low_open else value < low):
            bad = True
        if high is not None and value > high:
            bad = True
        if bad:
            raise argparse.ArgumentTypeError('{} is out of range: give {}'.format(text, takes))
        return value

    parse.__name__ = 'number'  # argparse names the type in some messages
    return parse


def seconds(off=None, low=0.0, low_open=True):
    """Return the type of a time in seconds: > 0 (or ``off``)."""
    return number(float, low=low, low_open=low_open, off=off, unit='seconds')


def count(low=1, high=None):
    """Return the type of a count (an integer >= ``low``)."""
    return number(int, low=low, high=high)
