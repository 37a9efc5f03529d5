"""Helpers for the tests that run the docs' runnable blocks (not a test module).

A runnable block is a fenced code block right after a line ``<!-- runnable: NAME -->`` in
``README.md`` or ``docs/*.md``; the tests copy it out unchanged and run it.
"""

import collections
import glob
import os
import re
import signal
import subprocess
import time

__all__ = ['Block', 'DOC_FILES', 'ROOT', 'Run', 'block', 'doc_files', 'runnable_blocks',
           'run_in_session']

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

Block = collections.namedtuple('Block', ['name', 'lang', 'text', 'path', 'line'])
Run = collections.namedtuple('Run', ['returncode', 'stdout', 'stderr', 'seconds', 'timed_out'])

_MARKER = re.compile(r'^<!--\s*runnable:\s*([A-Za-z0-9_.-]+)\s*-->\s*$')
_FENCE = re.compile(r'^(```+)\s*([A-Za-z0-9_+-]*)\s*$')


def doc_files():
    """Return README.md and every docs/*.md of the checkout, sorted."""
    return [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


DOC_FILES = doc_files()


def runnable_blocks(paths=None):
    """Return every runnable block of ``paths`` (default: README.md and docs/*.md) in order.

    Raises ValueError when a marker is not followed by a fenced block, or a block is not closed.
    """
    out = []
    for path in (DOC_FILES if paths is None else paths):
        with open(path, encoding='utf-8') as f:
            lines = f.read().splitlines()
        i = 0
        while i < len(lines):
            m = _MARKER.match(lines[i])
            i += 1
            if not m:
                continue
            where = '{}:{}'.format(os.path.relpath(path, ROOT), i)
            fence = _FENCE.match(lines[i]) if i < len(lines) else None
            if fence is None:
                raise ValueError('{}: <!-- runnable: {} --> must be followed directly by a fenced code '
                                 'block (```bash or ```python)'.format(where, m.group(1)))
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(1)),
                       None)
            if end is None:
                raise ValueError('{}: runnable block {!r} is never closed'.format(where, m.group(1)))
            out.append(Block(m.group(1), fence.group(2), '\n'.join(lines[i + 1:end]) + '\n', path,
                             i + 1))
            i = end + 1
    return out


def block(name):
    """Return the one runnable block called ``name``; fail clearly if there is none or several."""
    found = [b for b in runnable_blocks() if b.name == name]
    if len(found) != 1:
        raise AssertionError('expected one block after <!-- runnable: {} --> in README.md or docs/*.md, '
                             'found {}'.format(name, len(found)))
    return found[0]


def _killpg(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_in_session(cmd, timeout, cwd=None, env=None, merge=False):
    """Run ``cmd`` in its own session; kill the whole session on timeout; return a Run.

    ``merge``: stderr goes into stdout, in the order the two were written (as on a terminal).
    """
    start = time.monotonic()
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                            stdin=subprocess.DEVNULL, cwd=cwd, env=env, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _killpg(proc)
        out, err = proc.communicate()
    finally:
        _killpg(proc)
    return Run(proc.returncode, out.decode(errors='replace'), (err or b'').decode(errors='replace'),
               time.monotonic() - start, timed_out)
