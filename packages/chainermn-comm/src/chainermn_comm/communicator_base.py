"""The interface every chainermn communicator implements."""

import abc
import contextlib

from chainermn_comm.reduce import dtypes as _dtypes

__all__ = ['CommunicatorBase']


class CommunicatorBase(abc.ABC):
    """Interface definition of all communicators.

    Methods without a suffix handle ndarrays (NumPy, or CuPy on GPU
    communicators); methods with the ``_obj`` suffix handle picklable Python
    objects. Every abstract method must be implemented by a concrete class.

    The ``_obj`` methods unpickle what other ranks sent.  That is safe because only
    the processes of this MPI job (the same program, started by the same user) can
    send on its communicator; never use them to pass on bytes read from files or
    from outside the job.
    """

    # -- topology: properties a communicator defines (as in v7 none is abstract: a communicator of
    # the user's own that lacks one raises when it is read) ----------------------------------
    def _undefined(self, what):
        return NotImplementedError('{} does not define {}; a communicator class defines its '
                                   'topology properties'.format(type(self).__name__, what))

    @property
    def rank(self):
        """Rank (process id in the cluster) of this process."""
        raise self._undefined('rank')

    @property
    def size(self):
        """Number of processes of the cluster."""
        raise self._undefined('size')

    @property
    def intra_rank(self):
        """Intra rank (process id in the machine) of this process."""
        raise self._undefined('intra_rank')

    @property
    def intra_size(self):
        """Number of processes on this machine."""
        raise self._undefined('intra_size')

    @property
    def inter_rank(self):
        """The rank of this node in the cluster."""
        raise self._undefined('inter_rank')

    @property
    def inter_size(self):
        """Number of nodes that participate in the cluster."""
        raise self._undefined('inter_size')

    @property
    def mpi_comm(self):
        """The underlying mpi4py communicator."""
        raise self._undefined('mpi_comm')

    # -- ndarray / object methods, in the reference's order ---------------
    @abc.abstractmethod
    def send(self, data, dest, tag):
        """Send an ndarray (or a tuple/list of ndarrays) to ``dest``."""

    @abc.abstractmethod
    def recv(self, source, tag):
        """Receive an ndarray (or a tuple of ndarrays) from ``source``."""

    @abc.abstractmethod
    def bcast(self, data, max_buf_len=None, root=0):
        """Broadcast an ndarray from ``root`` to all processes."""

    @abc.abstractmethod
    def gather(self, data, root=0):
        """Gather ndarrays of all processes to ``root``."""

    @abc.abstractmethod
    def allreduce(self, data):
        """Reduce an ndarray over all processes and return the result to all."""

    @abc.abstractmethod
    def alltoall(self, xs):
        """Send ``xs[i]`` to rank ``i`` and return what every rank sent here."""

    @abc.abstractmethod
    def scatter(self, xs, root=0):
        """Scatter ``xs[i]`` from ``root`` to rank ``i``."""

    @abc.abstractmethod
    def allgather(self, x):
        """Gather ``x`` of every process on every process."""

    @abc.abstractmethod
    def send_obj(self, obj, dest, tag):
        """Send a picklable object to ``dest``."""

    @abc.abstractmethod
    def recv_obj(self, source, status=None, tag=None):
        """Receive a picklable object from ``source`` (any tag when ``tag`` is None); fill ``status``."""

    @abc.abstractmethod
    def bcast_obj(self, obj, max_buf_len=None, root=0):
        """Broadcast a picklable object from ``root``."""

    @abc.abstractmethod
    def gather_obj(self, obj, root=0):
        """Gather picklable objects of all processes to ``root``."""

    def allgather_obj(self, obj):
        """Gather a picklable object of every process on every process (a list; here gather + bcast)."""
        return self.bcast_obj(self.gather_obj(obj))

    @abc.abstractmethod
    def allreduce_obj(self, obj):
        """Reduce picklable objects (sum by default) and return the result to all."""

    @abc.abstractmethod
    def bcast_data(self, model):
        """Broadcast the parameter data of a Chainer link from rank 0."""

    def multi_node_mean_grad(self, model, zero_fill=True):
        """Average the parameter gradients of a Chainer link over all processes.

        With ``zero_fill`` a parameter whose gradient is ``None`` takes part with zeros (and
        receives the average); without it such parameters are skipped, so every rank must then
        have gradients for the same parameters.  A communicator class implements this (or, as
        older code does, ``allreduce_grad``, which this then calls).
        """
        if type(self).allreduce_grad is not CommunicatorBase.allreduce_grad:
            return self.allreduce_grad(model, zero_fill=zero_fill)
        raise NotImplementedError('{} must implement multi_node_mean_grad(model, zero_fill=True)'.format(
            type(self).__name__))

    def allreduce_grad(self, model, zero_fill=True):
        """Deprecated alias of :meth:`multi_node_mean_grad` (Chainer v7's older name)."""
        return self.multi_node_mean_grad(model, zero_fill=zero_fill)

    #: The communicator's call guard (agreement check, watchdog, trace), or None when it has
    #: none (a communicator of the user's own): comm's internal API for its sibling packages.
    guard = None
    #: The communicator's averaging interface (``chainermn_comm.averaging.Averaging``), or None.
    averaging = None

    # -- configurations (Chainer v7's set_config / get_config) -------------------------------
    #: The configurations ``set_config`` and ``get_config`` know: attribute names of the communicator.
    config_names = ()

    def set_config(self, name, value=True, **kwargs):
        """Set the configuration ``name`` to ``value`` (names in ``config_names``; Chainer v7's API)."""
        if name not in self.config_names:
            raise ValueError('Unknown config: {!r}; {} has {}'.format(
                name, type(self).__name__, ', '.join(map(repr, self.config_names)) or 'none'))
        self._set_config(name, value)

    def _set_config(self, name, value):
        if name == 'allreduce_grad_dtype':
            value = _dtypes.validate_grad_dtype(value)
        elif name == 'batched_copy':
            value = bool(value)
        setattr(self, name, value)

    def get_config(self, name=None):
        """Return the configuration ``name``'s value, or a dict of all of them when ``name`` is None."""
        if name is None:
            return {n: getattr(self, n) for n in self.config_names}
        if name not in self.config_names:
            raise KeyError('Unknown config: {!r}; {} has {}'.format(
                name, type(self).__name__, ', '.join(map(repr, self.config_names)) or 'none'))
        return getattr(self, name)

    @contextlib.contextmanager
    def config_scope(self):
        """Run a block in which configurations are set (Chainer v7's API; ``get_config`` reads them directly)."""
        old, self._within_config_scope = self.within_config_scope, True
        try:
            yield
        finally:
            self._within_config_scope = old

    @property
    def within_config_scope(self):
        """Whether a ``config_scope`` block is running."""
        return self.__dict__.get('_within_config_scope', False)

    @abc.abstractmethod
    def split(self, color, key):
        """Split into sub-communicators like ``MPI_Comm_split``."""

    def finalize(self):
        """Release what the communicator holds; later calls raise, a second finalize does nothing.

        Collective: call it on every rank of the communicator, after the last communication.
        This base implementation holds nothing and does nothing.
        """
