"""create_multi_node_n_step_rnn: an NStep RNN whose states come from and go to other ranks."""

import chainer

from chainermn_links._share_comm import deepcopy_sharing_comm
from chainermn_links.functions.point_to_point import recv, send

__all__ = ['MultiNodeNStepRNN', 'create_multi_node_n_step_rnn']


def _check_rank(comm, rank, what):
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < comm.size:
        raise ValueError('rank {}: create_multi_node_n_step_rnn {} must be None or an int in 0..{}; '
                         'got {!r}'.format(comm.rank, what, comm.size - 1, rank))
    if rank == comm.rank:
        raise ValueError('rank {}: create_multi_node_n_step_rnn {}={} names this process itself; the '
                         'states of the previous/next layer of a stack must live on another rank (use '
                         'None for the ends of the stack)'.format(comm.rank, what, rank))
    return rank


class MultiNodeNStepRNN(chainer.Chain):
    """Run ``actual_rnn`` with initial states received from ``rank_in``; send its final states to ``rank_out``.

    Calling it with the inputs of the wrapped link without its initial states (``xs``)
    returns the wrapped link's outputs (``hy, ys`` or ``hy, cy, ys`` for LSTMs) followed by a
    delegate variable, which is None when ``rank_out`` is None.  Connect the delegate to the
    loss (:func:`chainermn.functions.pseudo_connect`) or call ``backward()`` on it, so that
    backward receives the gradients of the sent states from ``rank_out``.  Backward also sends
    the gradients of the received states back to ``rank_in``.
    """

    def __init__(self, actual_rnn, communicator, rank_in=None, rank_out=None):
        super().__init__()
        n_cells = getattr(actual_rnn, 'n_cells', None)
        if not isinstance(actual_rnn, chainer.Link) or not isinstance(n_cells, int):
            raise TypeError('rank {}: create_multi_node_n_step_rnn needs an NStep RNN link (e.g. '
                            'chainer.links.NStepLSTM, NStepGRU, NStepRNNTanh); got {}'.format(
                                communicator.rank, type(actual_rnn).__name__))
        with self.init_scope():
            self.actual_rnn = actual_rnn
        self.communicator = communicator
        self.rank_in = _check_rank(communicator, rank_in, 'rank_in')
        self.rank_out = _check_rank(communicator, rank_out, 'rank_out')
        self.n_cells = n_cells

    def __deepcopy__(self, memo):
        memo.setdefault(id(self.communicator), self.communicator)
        return deepcopy_sharing_comm(self, memo)

    def forward(self, *inputs):
        """Return the wrapped link's outputs for ``inputs`` plus the delegate variable of the send."""
        comm = self.communicator
        if self.rank_in is None:
            states = (None,) * self.n_cells
        else:
            states = recv(comm, self.rank_in, force_tuple=True)
            if len(states) != self.n_cells:
                raise ValueError(
                    'rank {}: multi-node {} expects {} state array(s) from rank {} but received {}; '
                    'stack RNNs with the same number of states (LSTMs pass hidden and cell states, '
                    'GRUs and plain RNNs the hidden state only)'.format(
                        comm.rank, type(self.actual_rnn).__name__, self.n_cells, self.rank_in, len(states)))
        outputs = tuple(self.actual_rnn(*(states + inputs)))
        delegate = None
        if self.rank_out is not None:
            delegate = send(outputs[:self.n_cells], comm, self.rank_out)
        return outputs + (delegate,)


def create_multi_node_n_step_rnn(actual_link, communicator, rank_in=None, rank_out=None):
    """Wrap an NStep RNN link so that its states come from ``rank_in`` and go to ``rank_out``.

    Stacks RNN layers over processes: each rank's layer starts from the final hidden (and,
    for LSTMs, cell) states of the layer on ``rank_in`` and passes its own final states on to
    ``rank_out``; None ends the stack.  See :class:`MultiNodeNStepRNN` for the call.
    """
    return MultiNodeNStepRNN(actual_link, communicator, rank_in=rank_in, rank_out=rank_out)
