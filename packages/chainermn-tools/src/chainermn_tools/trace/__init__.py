"""``python -m chainermn trace DIR``: where the time of a traced run went.

Reads what ``CHAINERMN_TRACE=DIR`` recorded (``DIR/trace.json``, or the part files
``DIR/trace.rank<R>.json``; docs/trace.md), prints per rank the median and 95th percentile per
iteration of compute, exposed communication, waiting, data, io and eval, the share of
communication hidden behind compute, the gradient all-reduce's bandwidth and one line per
straggler, and writes ``DIR/trace.png`` (needs matplotlib: ``pip install "chainermn[plot]"``).
Exit status 0, or 2 when there is no trace to read.
"""

import argparse
import os
import sys

from chainermn_tools._args import count
from chainermn_tools.trace._analyse import analyse
from chainermn_tools.trace._load import TraceMissing, load
from chainermn_tools.trace._text import render

__all__ = ['main', 'report', 'TraceMissing']

EXIT_NO_TRACE = 2


def report(path):
    """Return the analysed Report of the trace in ``path`` (raises TraceMissing or ValueError)."""
    return analyse(load(path))


def _png_path(path, out):
    if out:
        return out
    return os.path.join(path if os.path.isdir(path) else os.path.dirname(path) or '.', 'trace.png')


def main(argv=None):
    """Command-line entry point; return the exit status."""
    parser = argparse.ArgumentParser(prog='python -m chainermn trace', description=__doc__.split('\n')[0])
    parser.add_argument('dir', metavar='DIR', help='the directory CHAINERMN_TRACE named (or its trace.json)')
    parser.add_argument('--png', metavar='PATH', help='where to write the picture (default DIR/trace.png)')
    parser.add_argument('--no-png', action='store_true', help='print the text report only')
    parser.add_argument('--iterations', type=count(), default=3, metavar='K',
                        help='consecutive iterations the timeline shows (default 3)')
    args = parser.parse_args(argv)
    try:
        result = report(args.dir)
    except (TraceMissing, ValueError) as e:
        sys.stderr.write('python -m chainermn trace: {}\n'.format(e))
        return EXIT_NO_TRACE
    sys.stdout.write(render(result) + '\n')
    if not args.no_png:
        from chainermn_tools.trace._plot import PlotUnavailable, write_png
        png = _png_path(args.dir, args.png)
        try:
            write_png(result, png, iterations=args.iterations)
            sys.stdout.write('wrote {}\n'.format(png))
        except PlotUnavailable as e:
            sys.stdout.write('no picture: {}\n'.format(e))
        except OSError as e:
            sys.stdout.write('no picture: cannot write {}: {}\n'.format(png, e))
    sys.stdout.flush()
    return 0
