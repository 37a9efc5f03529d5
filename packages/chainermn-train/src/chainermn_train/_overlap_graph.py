"""The graph side of ``overlap=True``: which parameters each function consumes, and when a gradient is final.

:func:`consumers` walks the graph from the loss once before backward; :class:`FinalGradHook`
counts consumers down during backward and reports each parameter's gradient as soon as its last
consumer has run (see :mod:`chainermn_train._overlap`).
"""

import sys

import chainer
from chainer import _backprop_utils

__all__ = ['consumers', 'FinalGradHook', 'backprop_frame_code']


def backprop_frame_code():
    """Return the code of Chainer's backward loop that calls backward_postprocess (or None)."""
    try:
        from chainer import _backprop
        return _backprop._backprop_to_all.__code__
    except (ImportError, AttributeError):
        return None


def consumers(loss, index, n):
    """Walk the graph from ``loss``: consumers per function, count and finishing order per parameter.

    Returns ``({id(function): parameter indices}, [consumers per parameter], order,
    communicates)`` where ``order`` lists parameter indices by when their gradient becomes
    final in backward and ``communicates`` tells whether a chainermn function (send, recv,
    collectives) is in the graph.
    """
    per_func = {}
    count = [0] * n
    last_rank = [None] * n
    communicates = False
    seen = set()
    stack = [loss.creator_node]
    while stack:
        f = stack.pop()
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        communicates = communicates or type(f).__module__.startswith('chainermn_links')
        hits = set()
        for x in f.inputs:
            i = index.get(id(x))
            if i is not None:
                hits.add(i)
            elif x.creator_node is not None:
                stack.append(x.creator_node)
        if hits:
            per_func[id(f)] = tuple(sorted(hits))
            for i in hits:
                count[i] += 1
                if last_rank[i] is None or f.rank < last_rank[i]:
                    last_rank[i] = f.rank
    # Highest last-consumer rank finishes first; unused parameters go last.
    order = sorted(range(n), key=lambda i: (last_rank[i] is None, -(last_rank[i] or 0), i))
    return per_func, count, order, communicates


class FinalGradHook(chainer.FunctionHook):
    """Report each parameter's gradient as soon as its last consumer's backward has run."""

    name = 'chainermn_overlap'

    def __init__(self, index, consumers, count, on_final, code):
        self._index = index
        self._consumers = consumers
        self._remaining = list(count)
        self._on_final = on_final
        self._code = code

    def backward_postprocess(self, function, in_data, out_grad):
        hits = self._consumers.get(id(function))
        if not hits:
            return
        final = set()
        for i in hits:
            self._remaining[i] -= 1
            if self._remaining[i] == 0:
                final.add(i)
        if not final:
            return
        frame = sys._getframe(1)
        if frame.f_code is not self._code:
            return  # not Chainer 7.8.1's backward loop: these gradients are taken after backward
        in_grad = frame.f_locals.get('in_grad')
        if in_grad is None:
            return
        for x in function.inputs:
            i = self._index.get(id(x))
            if i not in final or x not in in_grad:
                continue
            final.discard(i)
            gvar = _backprop_utils._reduce(in_grad[x])  # sums in place, as backward will later
            self._on_final(i, None if gvar is None else gvar.array)
