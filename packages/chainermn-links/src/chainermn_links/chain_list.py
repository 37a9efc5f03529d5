"""MultiNodeChainList: a model made of components that exchange variables with other ranks."""

import collections

import chainer

from chainermn_links._share_comm import deepcopy_sharing_comm
from chainermn_links.functions.point_to_point import recv, send
from chainermn_links.functions.pseudo_connect import pseudo_connect

__all__ = ['MultiNodeChainList']


def _rank_list(value, what, comm):
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out = []
    for r in items:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < comm.size:
            raise ValueError('rank {}: MultiNodeChainList.add_link {} must be None, an int or a list of '
                             'ints in 0..{}; got {!r}'.format(comm.rank, what, comm.size - 1, value))
        out.append(r)
    if not out:
        raise ValueError('rank {}: MultiNodeChainList.add_link {} is an empty list; use None'.format(
            comm.rank, what))
    return out


def _is_data(x):
    return isinstance(x, chainer.Variable) or (hasattr(x, 'shape') and hasattr(x, 'dtype'))


def _as_tuple(y):
    return tuple(y) if isinstance(y, (tuple, list)) else (y,)


def _connect(delegate, y):
    """Return ``y`` (a Variable or a tuple) connected to ``delegate``, keeping its structure."""
    if isinstance(y, (tuple, list)):
        out = pseudo_connect(delegate, *y)
        return out if isinstance(out, tuple) else (out,)
    return pseudo_connect(delegate, y)


class MultiNodeChainList(chainer.ChainList):
    """Combine the non-connected components of a model split over processes.

    Each component (a :class:`chainer.Link`) is registered with :meth:`add_link` together with
    the ranks it receives its input from (``rank_in``) and sends its output to (``rank_out``);
    ``None`` means the model's own inputs / outputs.  ``__call__`` runs the components in the
    order they were added and connects them with delegate variables, so backward runs them
    (and their sends and receives) in the reverse order.  It returns the output of the last
    component with ``rank_out=None`` (connected to everything sent after it), or, when no
    component produces model outputs, the delegate variable of the last send: call
    ``backward()`` on what it returns on every rank.

    A component may name this process itself in ``rank_in`` / ``rank_out`` (alone or in a
    list with other ranks): what it sends to itself goes into a local first-in first-out
    queue instead of MPI, a later component that names this rank in ``rank_in`` takes it
    from there, and backward returns the gradient through the same local graph.
    """

    def __init__(self, comm):
        super().__init__()
        self.comm = comm
        self._rank_inouts = []
        self._queued = 0     # outputs sent to this process itself and not yet received

    def __deepcopy__(self, memo):
        return deepcopy_sharing_comm(self, memo)

    def add_link(self, link, rank_in=None, rank_out=None):
        """Register ``link`` that receives from ``rank_in`` and sends to ``rank_out`` (int, list or None).

        With a list ``rank_in`` the link is called with one argument per source rank (a
        Variable, or a tuple if a tuple was sent); with an int it gets one such argument; with
        None it gets the model's inputs.  Its output (a Variable or a tuple) is sent to every
        rank of ``rank_out`` in order, or becomes the model output when ``rank_out`` is None.
        This process's own rank may appear in both; it goes through a local queue (first in,
        first out), so a ``rank_in`` naming it needs an earlier ``rank_out`` naming it.
        """
        me = self.comm.rank
        in_ranks = _rank_list(rank_in, 'rank_in', self.comm)
        out_ranks = _rank_list(rank_out, 'rank_out', self.comm)
        gets = in_ranks.count(me) if in_ranks else 0
        if gets > self._queued:
            raise ValueError(
                'rank {0}: MultiNodeChainList.add_link rank_in={1!r} receives {2} input(s) from this '
                'process itself, but the earlier components send only {3} output(s) to it that are not '
                'received yet; add a component with rank_out={0} (or a list containing {0}) before '
                'this one'.format(me, rank_in, gets, self._queued))
        super().add_link(link)
        self._rank_inouts.append((in_ranks, out_ranks))
        self._queued += (out_ranks.count(me) if out_ranks else 0) - gets

    def forward(self, *inputs):
        """Run every component in order; see the class docstring for what is returned."""
        comm = self.comm
        if self._queued:
            raise ValueError(
                'rank {0}: MultiNodeChainList components send {1} output(s) to this process itself '
                '(rank_out={0}) that no later component receives (rank_in={0}); add the receiving '
                'components or drop {0} from rank_out'.format(comm.rank, self._queued))
        queue = collections.deque()   # what components sent to this process itself
        last = None          # the latest variable of this rank's graph (delegate or output)
        model_out = None     # output of the latest component with rank_out=None
        for link, (in_ranks, out_ranks) in zip(self._children, self._rank_inouts):
            if in_ranks is None:
                args = list(inputs)
                idx = [i for i, a in enumerate(args) if _is_data(a)]
                if last is not None and idx:
                    connected = _as_tuple(pseudo_connect(last, *[args[i] for i in idx]))
                    for i, c in zip(idx, connected):
                        args[i] = c
                    last_used = True
                else:
                    last_used = last is None
            else:
                args = []
                for r in in_ranks:
                    if r != comm.rank:
                        args.append(recv(comm, r, delegate_variable=last))
                        continue
                    item = queue.popleft()
                    # Connect it to the previous component so backward keeps the reverse order.
                    args.append(item if _as_tuple(item)[0] is last else _connect(last, item))
                last_used = True
            y = link(*args)
            if not last_used:
                # The component took no data from this rank: hang its output on ``last``.
                y = _connect(last, y)
            if out_ranks is None:
                model_out = y
                last = _as_tuple(y)[0]
            else:
                for i, r in enumerate(out_ranks):
                    if i > 0:
                        y = _connect(last, y)
                    if r == comm.rank:
                        queue.append(y)
                        last = _as_tuple(y)[0]
                    else:
                        last = send(y, comm, r)
        if model_out is None:
            return last
        if _as_tuple(model_out)[0] is last:
            return model_out
        return _connect(last, model_out)
