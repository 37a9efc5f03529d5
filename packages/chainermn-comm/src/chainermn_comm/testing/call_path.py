"""Measure which chainermn functions one call enters (``sys.setprofile``): the path's length.

Used by the test that keeps one steady-state update short (issue 50): every Python function
entered during the call whose code lives under ``packages/*/src`` counts once, comprehensions
and lambdas included; calls made in other threads are not seen.
"""

import os
import sys

__all__ = ['CallPath', 'measure', 'source_roots']


def source_roots():
    """Return the ``src`` folders of the installed chainermn packages (where their code lives)."""
    import chainermn_comm
    here = os.path.dirname(os.path.dirname(os.path.abspath(chainermn_comm.__file__)))
    roots = {here}
    parent = os.path.dirname(os.path.dirname(here))  # packages/
    if os.path.isdir(parent):
        for name in os.listdir(parent):
            src = os.path.join(parent, name, 'src')
            if os.path.isdir(src):
                roots.add(src)
    return sorted(roots)


class CallPath:
    """The chainermn functions one call entered: ``functions`` {(file, line, name): calls}."""

    def __init__(self, functions, roots):
        self.functions = dict(functions)
        self.roots = list(roots)

    @property
    def files(self):
        """The files of the functions entered, sorted."""
        return sorted({f for f, _, _ in self.functions})

    @property
    def calls(self):
        """Calls of those functions, in all."""
        return sum(self.functions.values())

    def _short(self, path):
        for root in self.roots:
            if path.startswith(root + os.sep):
                return os.path.relpath(path, root)
        return path

    def listing(self):
        """Return the path as text: one line per function (file:line name xcalls), then the totals."""
        lines = ['{}:{} {} x{}'.format(self._short(f), line, name, n)
                 for (f, line, name), n in sorted(self.functions.items())]
        lines.append('{} functions, {} calls, {} files: {}'.format(
            len(self.functions), self.calls, len(self.files),
            ', '.join(self._short(f) for f in self.files)))
        return '\n'.join(lines)


def measure(fn, *args, roots=None, **kwargs):
    """Run ``fn(*args, **kwargs)`` and return (its result, the :class:`CallPath` of chainermn functions)."""
    roots = source_roots() if roots is None else list(roots)
    prefixes = tuple(r + os.sep for r in roots)
    seen = {}
    me = os.path.abspath(__file__)

    def profile(frame, event, arg):
        if event != 'call':
            return
        code = frame.f_code
        path = code.co_filename
        if path.startswith(prefixes) and path != me:
            key = (path, code.co_firstlineno, getattr(code, 'co_qualname', code.co_name))
            seen[key] = seen.get(key, 0) + 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return result, CallPath(seen, roots)
