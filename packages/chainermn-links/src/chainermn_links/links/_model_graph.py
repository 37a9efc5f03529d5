"""Walk the objects a model's forward pass can reach, and swap objects for others wherever they are held.

A model's forward reaches its links through more than its registered children: ``Sequential``
keeps the callables it runs in its own list, a ``Chain`` may keep its links in a plain list or
dict, a layer may be a bound method or a ``functools.partial``.  :func:`walk` follows all of
these: the ``__dict__`` of links and of plain objects, lists, tuples, dicts, sets, partials,
bound methods, and the closure cells and defaults of functions.  It does not follow module
globals, class attributes, arrays, variables or communicators.
"""

import functools
import types

import chainer
import numpy
from chainermn_comm import CommunicatorBase

__all__ = ['walk', 'Visitor']

#: Objects the walk never enters (their insides hold no link a forward pass calls).
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), type, types.ModuleType,
           types.BuiltinFunctionType, types.CodeType, numpy.ndarray, numpy.generic, numpy.dtype,
           numpy.ufunc, chainer.Variable, CommunicatorBase, range, slice)


def _is_leaf(obj):
    if isinstance(obj, _LEAVES):
        return True
    # Device arrays (CuPy, ChainerX) and other array-likes: data, not model structure.
    return hasattr(obj, 'shape') and hasattr(obj, 'dtype') and not isinstance(obj, chainer.Link)


class Visitor:
    """What :func:`walk` asks at each object: hooks that subclasses override."""

    def replacement(self, obj, path):
        """Return the object to hold instead of ``obj`` (``obj`` itself to keep it and walk into it)."""
        return obj

    def enter(self, obj, path):
        """Return False to leave ``obj`` (reached first at ``path``) unwalked."""
        return True


def _items(obj):
    """Yield (label, value, key) for what ``obj`` holds; ``key`` says how to put a new value back."""
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield '[{}]'.format(i), v, i
    elif isinstance(obj, dict):
        for k, v in list(obj.items()):
            yield '[{!r}]'.format(k), v, k
    elif isinstance(obj, (set, frozenset)):
        for v in list(obj):
            yield '{...}', v, ('member', v)
    elif isinstance(obj, functools.partial):
        yield '.func', obj.func, 'func'
        for i, v in enumerate(obj.args):
            yield '.args[{}]'.format(i), v, ('args', i)
        for k, v in obj.keywords.items():
            yield '.keywords[{!r}]'.format(k), v, ('keywords', k)
    elif isinstance(obj, types.MethodType):
        yield '.__self__', obj.__self__, '__self__'
    elif isinstance(obj, types.FunctionType):
        # Closures and defaults are shared by every copy of the function: report, never rewrite.
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:   # an empty cell
                continue
            yield ' (closure variable {!r})'.format(name), value, None
        for i, v in enumerate(obj.__defaults__ or ()):
            yield ' (default argument {})'.format(i), v, None
        for k, v in (obj.__kwdefaults__ or {}).items():
            yield ' (default argument {!r})'.format(k), v, None
    else:
        d = getattr(obj, '__dict__', None)
        if isinstance(d, dict):
            # A Sequential's layers first, and named as users index them: model[i].
            keys = sorted(d, key=lambda k: k != '_layers')
            for k in keys:
                yield _label(obj, k), d[k], k


def _label(obj, key):
    if key == '_layers' and isinstance(obj, chainer.Sequential):
        return ''
    if key == '_children' and isinstance(obj, chainer.ChainList) and not isinstance(obj, chainer.Sequential):
        return ''
    return '.{}'.format(key)


def _rebuilt(obj, changes):
    """Return ``obj`` with ``changes`` ({key: new value}) applied: in place, or a new immutable object."""
    if isinstance(obj, (list, dict)):
        for k, v in changes.items():
            obj[k] = v
        return obj
    if isinstance(obj, (set, frozenset)):
        members = [changes.get(('member', v), v) for v in obj]
        if isinstance(obj, frozenset):
            return type(obj)(members)
        obj.clear()
        obj.update(members)
        return obj
    if isinstance(obj, tuple):
        items = [changes.get(i, v) for i, v in enumerate(obj)]
        return type(obj)._make(items) if hasattr(type(obj), '_make') else type(obj)(items)
    if isinstance(obj, functools.partial):
        func = changes.get('func', obj.func)
        args = tuple(changes.get(('args', i), v) for i, v in enumerate(obj.args))
        keywords = {k: changes.get(('keywords', k), v) for k, v in obj.keywords.items()}
        new = type(obj)(func, *args, **keywords)
        new.__dict__.update(obj.__dict__)
        return new
    if isinstance(obj, types.MethodType):
        return types.MethodType(obj.__func__, changes['__self__'])
    for k, v in changes.items():   # a link or another object: its attribute
        obj.__dict__[k] = v
    return obj


def walk(root, visitor, path='model'):
    """Walk everything reachable from ``root``; return ``root`` or what replaces it.

    Where ``visitor.replacement`` returns another object, the container that held the old one
    holds the new one afterwards (lists, dicts, sets and ``__dict__`` in place; tuples, frozensets,
    partials and bound methods rebuilt, and their holders updated).  Functions are walked but
    never rewritten (their closures are shared with every copy): the visitor sees what they
    reach and decides.  Each object is walked once, at the first path that reaches it.
    """
    done = {}

    def visit(obj, where):
        new = visitor.replacement(obj, where)
        if new is not obj or _is_leaf(obj):
            return new
        key = id(obj)
        if key in done:
            return done[key]
        done[key] = obj
        if not visitor.enter(obj, where):
            return obj
        changes = {}
        for label, value, slot in _items(obj):
            got = visit(value, where + label)
            if got is not value and slot is not None:
                changes[slot] = got
        if changes:
            new = _rebuilt(obj, changes)
            done[key] = new
            return new
        return obj

    return visit(root, path)
