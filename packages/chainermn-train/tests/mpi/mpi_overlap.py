"""Per-rank tests of BackwardOverlap (run under mpiexec by test_overlap_mpi.py)."""

import threading

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

import chainermn_comm
from chainermn_train._overlap import BackwardOverlap


class Net(chainer.Chain):
    def __init__(self, dtype=numpy.float32):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(6, 5, initialW=chainer.initializers.Normal(1.0, dtype=dtype),
                               initial_bias=chainer.initializers.Zero(dtype))
            self.l2 = L.Linear(5, 3, initialW=chainer.initializers.Normal(1.0, dtype=dtype),
                               initial_bias=chainer.initializers.Zero(dtype))
            self.unused = L.Linear(4, 2, initialW=chainer.initializers.Normal(1.0, dtype=dtype),
                                   initial_bias=chainer.initializers.Zero(dtype))

    def __call__(self, x):
        return self.l2(F.tanh(self.l1(x)) + self.l1(x))  # l1 used twice


def _pair(comm, dtype, seed):
    a = Net(dtype)
    comm.bcast_data(a)
    b = a.copy(mode='copy')
    x = numpy.random.RandomState(seed + comm.rank).standard_normal((4, 6)).astype(dtype)
    return a, b, x


@pytest.mark.parametrize('grad_dtype', [None, numpy.float16, numpy.float64, 'bfloat16'])
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_identical_to_plain_path(dtype, grad_dtype):
    comm = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=grad_dtype)
    a, b, x = _pair(comm, dtype, 3)
    a.cleargrads()
    F.sum(a(x) ** 2).backward()
    comm.multi_node_mean_grad(a, zero_fill=True)
    ov = BackwardOverlap(comm, b)
    b.cleargrads()
    ov.run_backward(F.sum(b(x) ** 2))
    pa, pb = dict(a.namedparams()), dict(b.namedparams())
    assert sorted(pa) == sorted(pb)
    for name in pa:
        assert pb[name].grad is not None, name
        assert pb[name].grad.dtype == pa[name].grad.dtype
        assert numpy.array_equal(pa[name].grad, pb[name].grad), name
    assert not pb['/unused/W'].grad.any()
    ov.free()


def test_values_are_the_mean_over_ranks():
    comm = chainermn_comm.create_communicator('naive')
    model = Net()
    comm.bcast_data(model)
    x = numpy.random.RandomState(11 + comm.rank).standard_normal((4, 6)).astype(numpy.float32)
    model.cleargrads()
    F.sum(model(x) ** 2).backward()
    local = {n: (p.grad.copy() if p.grad is not None else numpy.zeros_like(p.array))
             for n, p in model.namedparams()}
    ov = BackwardOverlap(comm, model)
    model.cleargrads()
    ov.run_backward(F.sum(model(x) ** 2))
    for n, p in model.namedparams():
        terms = numpy.asarray(comm.allgather(local[n]), dtype=numpy.float64)
        # float32 sums in any order stay within a few roundings of the terms' magnitudes, however
        # much they cancel (the weights are random, so a fixed tolerance fails now and then).
        bound = 4 * numpy.finfo(numpy.float32).eps * numpy.abs(terms).mean(axis=0)
        err = numpy.abs(p.grad.astype(numpy.float64) - terms.mean(axis=0))
        assert (err <= bound).all(), (n, p.grad, terms.mean(axis=0), err, bound)
    ov.free()


def test_backward_kwargs_and_repeated_use():
    comm = chainermn_comm.create_communicator('naive')
    a, b, x = _pair(comm, numpy.float32, 5)
    ov = BackwardOverlap(comm, b)
    for it in range(3):
        a.cleargrads()
        b.cleargrads()
        la = F.sum(a(x * (it + 1)) ** 2)
        la.backward(retain_grad=True)
        comm.multi_node_mean_grad(a)
        lb = F.sum(b(x * (it + 1)) ** 2)
        ov.run_backward(lb, retain_grad=True)
        assert lb.grad is not None and float(lb.grad) == 1.0
        for (n, pa), (_, pb) in zip(sorted(a.namedparams()), sorted(b.namedparams())):
            assert numpy.array_equal(pa.grad, pb.grad), (it, n)
    ov.free()


def test_gradients_are_averaged_during_backward():
    comm = chainermn_comm.create_communicator('naive')
    model = Net()
    comm.bcast_data(model)
    ov = BackwardOverlap(comm, model, bucket_bytes=1)  # one bucket per parameter
    model.cleargrads()
    x = numpy.ones((4, 6), numpy.float32)
    ov.run_backward(F.sum(model(x) ** 2))
    if comm.size > 1:
        # l1 and l2 (4 parameters) are used: their buckets start during backward, unless
        # the mode asks for one pass after backward.
        assert ov.early_params == (0 if ov.mode == 'end' else 4)
    ov.free()


@pytest.mark.parametrize('wire', [numpy.float16, 'bfloat16'])
@pytest.mark.parametrize('mode', ['thread', 'inline'])
def test_16bit_wire_is_averaged_during_backward_with_the_plain_bits(monkeypatch, mode, wire):
    from chainermn_train import _overlap
    monkeypatch.setenv(_overlap.MODE_ENV, mode)
    comm = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=wire)
    a, b, x = _pair(comm, numpy.float32, 7)
    a.cleargrads()
    F.sum(a(x) ** 2).backward()
    comm.multi_node_mean_grad(a, zero_fill=True)
    ov = BackwardOverlap(comm, b, bucket_bytes=1)  # one bucket per parameter
    b.cleargrads()
    ov.run_backward(F.sum(b(x) ** 2))
    if comm.size > 1:
        assert ov.early_params == 4  # l1 and l2 went over the wire in float16 during backward
    for (n, pa), (_, pb) in zip(sorted(a.namedparams()), sorted(b.namedparams())):
        assert pb.grad.dtype == numpy.float32
        assert numpy.array_equal(pa.grad, pb.grad), n
    ov.free()


class _WaitForBucket(chainer.FunctionNode):
    """Identity whose backward waits until the background thread has averaged a bucket."""

    def __init__(self, event, seen):
        super().__init__()
        self.event, self.seen = event, seen

    def forward(self, inputs):
        return inputs[0].copy(),

    def backward(self, indexes, grad_outputs):
        self.seen.append(self.event.wait(timeout=60))
        return grad_outputs[0] * 1,


def test_bucket_is_reduced_before_backward_finishes():
    """l2's gradients are averaged while backward still has to go through l1."""
    comm = chainermn_comm.create_communicator('naive')
    if comm.size == 1:
        pytest.skip('one rank: nothing is all-reduced')
    model = Net()
    comm.bcast_data(model)
    ov = BackwardOverlap(comm, model, bucket_bytes=1)
    if ov.mode == 'end':
        pytest.skip('mode end averages after backward')
    event, seen, calls = threading.Event(), [], []
    real_mean = ov._reducer.mean

    def mean(arrays, dtype=None, out=None):
        real_mean(arrays, dtype=dtype, out=out)
        calls.append(threading.current_thread().name)
        event.set()

    ov._reducer.mean = mean
    x = numpy.random.RandomState(comm.rank).standard_normal((4, 6)).astype(numpy.float32)
    h = _WaitForBucket(event, seen).apply((F.tanh(model.l1(x)),))[0]
    loss = F.sum(model.l2(h) ** 2)
    model.cleargrads()
    ov.run_backward(loss)
    assert seen == [True], 'no bucket was averaged while backward was running'
    want = 'chainermn-overlap' if ov.mode == 'thread' else threading.main_thread().name
    assert calls and all(name == want for name in calls)
    ov.free()


def test_different_graphs_raise_on_every_rank():
    comm = chainermn_comm.create_communicator('naive')
    if comm.size == 1:
        pytest.skip('one rank: nothing to compare')
    model = Net()
    comm.bcast_data(model)
    ov = BackwardOverlap(comm, model)
    if ov.mode == 'end':
        pytest.skip('mode end is the plain path: no buckets to match')
    x = numpy.ones((4, 6), numpy.float32)
    h = model(x)
    if comm.rank == 0:
        # Only rank 0 uses the link the others leave unused, after l2: its gradient is final
        # first there and last elsewhere, so the buckets would not match.
        h = F.sum(model.unused(F.concat((h, h[:, :1]), axis=1))) + h
    model.cleargrads()
    with pytest.raises(chainermn_comm.CommunicationError, match='different graphs'):
        ov.run_backward(F.sum(h ** 2))
    ov.free()


def test_mode_switch(monkeypatch):
    from chainermn_train import _overlap
    for mode in ('thread', 'inline', 'end'):
        monkeypatch.setenv(_overlap.MODE_ENV, mode)
        assert _overlap._pick_mode(64) == mode
    monkeypatch.setenv(_overlap.MODE_ENV, 'stream')  # device gradients only: host takes the default
    assert _overlap._pick_mode(64) == 'end'
    monkeypatch.setenv(_overlap.MODE_ENV, 'yes')
    with pytest.raises(ValueError, match=_overlap.MODE_ENV):
        _overlap._pick_mode(1)
    monkeypatch.delenv(_overlap.MODE_ENV)
    import os
    cores = os.cpu_count() or 1
    assert _overlap._pick_mode(1) == ('thread' if cores >= 2 else 'end')
    assert _overlap._pick_mode(cores) == 'end'


def test_host_gradients_never_take_the_device_path(monkeypatch):
    from chainermn_train import _overlap, _overlap_device
    comm = chainermn_comm.create_communicator('naive')
    model = chainer.links.Linear(3, 2)
    params = [p for _, p in sorted(model.namedparams())]
    assert _overlap_device.device_group(comm, params) is None  # naive: no NCCL group
    monkeypatch.setenv(_overlap.MODE_ENV, 'stream')
    ov = _overlap.BackwardOverlap(comm, model)
    assert ov._device_group(params) is None
    x = numpy.ones((4, 3), numpy.float32)
    model.cleargrads()
    ov.run_backward(F.sum(model(x)) * (comm.rank + 1))  # host path (plain at one rank), averaged
    assert numpy.array_equal(model.b.grad, numpy.full(2, 4.0 * (comm.size + 1) / 2, numpy.float32))
    ov.free()


class _HostCupy:
    """Just enough of CuPy, on NumPy arrays, to run the side-stream path's logic on a CPU."""

    def __init__(self):
        import types
        self.ndarray = numpy.ndarray
        self.multiply = numpy.multiply
        self.zeros = numpy.zeros
        self.empty = numpy.empty
        self.log = []
        log = self.log

        class Stream:
            def __init__(self, name):
                self.name = name

            def wait_event(self, ev):
                log.append(('wait', self.name, ev.stream))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class Event:
            def __init__(self, block=False, disable_timing=True):
                self.stream = None

            def record(self, stream=None):
                self.stream = stream.name

        compute = Stream('compute')
        self.side = Stream('side')
        self.cuda = types.SimpleNamespace(Event=Event, get_current_stream=lambda: compute)


class _HostGroup:
    """Stands in for NcclGroup: sums on the host, synchronously, and records the calls."""

    def __init__(self, comm, log):
        self.comm, self.log, self.size = comm, log, comm.size

    def allreduce_async(self, buf, stream, op='sum', what=''):
        from mpi4py import MPI
        assert stream.name == 'side' and op == 'sum'
        self.log.append(('allreduce', buf.size))
        self.comm.mpi_comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)

    def wait(self, stream, what):
        self.log.append(('wait_host', stream.name))


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_side_stream_path_logic_on_host_arrays(monkeypatch, dtype):
    """The device path's buckets, ordering, scaling and waits, with NumPy standing in for CuPy."""
    import sys
    from chainermn_train import _overlap, _overlap_device
    comm = chainermn_comm.create_communicator('naive')
    fake = _HostCupy()
    monkeypatch.setitem(sys.modules, 'cupy', fake)
    monkeypatch.setenv(_overlap.MODE_ENV, 'stream')
    monkeypatch.setattr(_overlap_device, 'device_group', lambda c, p: _HostGroup(c, fake.log))
    a, b, x = _pair(comm, dtype, 11)
    a.cleargrads()
    F.sum(a(x) ** 2).backward()
    for p in a.params():  # the plain device path scales before it sums
        if p.grad is not None:
            p.grad = p.grad * (1.0 / comm.size)
    sums = {n: comm.allreduce(p.grad) if p.grad is not None else None for n, p in a.namedparams()}
    ov = BackwardOverlap(comm, b, bucket_bytes=1)  # one parameter per bucket
    monkeypatch.setattr(ov, '_side_stream', lambda: fake.side)
    for _ in range(2):
        del fake.log[:]
        b.cleargrads()
        ov.run_backward(F.sum(b(x) ** 2))
        for name, p in b.namedparams():
            if sums[name] is None:
                assert not p.grad.any(), name
            else:
                assert numpy.array_equal(p.grad, sums[name]), name
            assert p.grad.base is ov._layout.flat or p.grad.base is ov._layout.flat.base, name
        reduces = [e for e in fake.log if e[0] == 'allreduce']
        assert len(reduces) == len(ov._layout.buckets) == 6
        assert [n for _, n in reduces] == [ov._layout.bucket_span(k)[1] - ov._layout.bucket_span(k)[0]
                                           for k in range(6)]
        assert all(e == ('wait', 'side', 'compute') for e in fake.log if e[0] == 'wait')
        assert fake.log[-1] == ('wait_host', 'side')  # the host waits once, after backward
        assert ov.early_params == 4  # l1 and l2 during backward; the unused link after it


def test_graph_with_collectives_in_backward():
    """MultiNodeBatchNormalization all-reduces in backward: no deadlock, same bits as plain."""
    from chainermn_links.links import MultiNodeBatchNormalization

    class BNNet(chainer.Chain):
        def __init__(self, comm):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(6, 5)
                self.bn = MultiNodeBatchNormalization(5, comm)
                self.l2 = L.Linear(5, 3)

        def __call__(self, x):
            return self.l2(F.relu(self.bn(self.l1(x))))

    comm = chainermn_comm.create_communicator('naive')
    a = BNNet(comm)
    comm.bcast_data(a)
    b = a.copy(mode='copy')
    x = numpy.random.RandomState(comm.rank).standard_normal((4, 6)).astype(numpy.float32)
    a.cleargrads()
    F.sum(a(x) ** 2).backward()
    comm.multi_node_mean_grad(a)
    ov = BackwardOverlap(comm, b, bucket_bytes=1)
    b.cleargrads()
    ov.run_backward(F.sum(b(x) ** 2))
    for (n, pa), (_, pb) in zip(sorted(a.namedparams()), sorted(b.namedparams())):
        assert numpy.array_equal(pa.grad, pb.grad), n
    if comm.size > 1 and ov.mode == 'inline':
        assert ov.early_params == 0  # averaged after backward
    ov.free()


def test_tuned_knobs_keep_the_plain_bits(monkeypatch):
    """Mode, bucket size and the reducer's knobs change during the first updates: every update
    has the bits of backward followed by multi_node_mean_grad (itself tuning its own knobs)."""
    from chainermn_train import _overlap
    monkeypatch.delenv(_overlap.MODE_ENV, raising=False)
    monkeypatch.delenv(_overlap.BUCKET_ENV, raising=False)
    comm = chainermn_comm.create_communicator('naive')
    a, b, x = _pair(comm, numpy.float32, 9)
    ov = BackwardOverlap(comm, b)
    seen = set()
    for it in range(48):
        a.cleargrads()
        F.sum(a(x * (it + 1)) ** 2).backward()
        comm.multi_node_mean_grad(a, zero_fill=True)
        b.cleargrads()
        ov.run_backward(F.sum(b(x * (it + 1)) ** 2))
        seen.add((ov.mode, ov.bucket_bytes))
        for (n, pa), (_, pb) in zip(sorted(a.namedparams()), sorted(b.namedparams())):
            assert numpy.array_equal(pa.grad, pb.grad), (it, n, ov.mode, ov.bucket_bytes)
    if comm.size > 1:
        tuner = ov.tuning.tuner
        figures = tuner.history[0][1]
        assert 'mode' in figures and ('bucket' in figures) == (tuner.choice['mode'] != 'end')
        assert {m for m, _ in seen} == {'thread', 'inline', 'end'}
        assert len(seen) == (3 if tuner.choice['mode'] == 'end' else 5)  # buckets: 3 sizes, 2 new
        assert tuner.choice['mode'] in ('thread', 'inline', 'end')
        everyone = comm.allgather_obj(sorted(tuner.choice.items(), key=repr))
        assert all(e == everyone[0] for e in everyone)
    ov.free()


def test_auto_wire_averages_on_every_update(monkeypatch):
    """'auto' tries float32 and a 16-bit wire on the first updates (here float16, the costlier
    cast, forced): each is an average within its own precision, and every rank ends with the same
    choice and the same bits."""
    from chainermn_comm.reduce import tune as _tune
    monkeypatch.setattr(_tune, '_FLOAT16_SHARE', float('inf'))  # float16 whatever its casts cost
    monkeypatch.setenv('CHAINERMN_TUNE', '0')  # the wire alone: a warm-up and 3 wires in 1 to 3 rounds
    monkeypatch.setenv('CHAINERMN_SHM_REDUCE', '0')  # one node in shared memory has no wire to tune
    comm = chainermn_comm.create_communicator('naive', allreduce_grad_dtype='auto')
    model = Net()
    comm.bcast_data(model)
    ov = BackwardOverlap(comm, model)
    x = numpy.random.RandomState(31 + comm.rank).standard_normal((4, 6)).astype(numpy.float32)
    for it in range(16):
        model.cleargrads()
        F.sum(model(x) ** 2).backward()
        local = {n: (p.grad.copy() if p.grad is not None else numpy.zeros_like(p.array))
                 for n, p in model.namedparams()}
        model.cleargrads()
        ov.run_backward(F.sum(model(x) ** 2))
        for n, p in model.namedparams():
            allg = comm.allgather(local[n])
            top = max(float(numpy.abs(g).max()) for g in allg) or 1.0
            numpy.testing.assert_allclose(p.grad, numpy.mean(allg, axis=0), rtol=0, atol=top * 2.0 ** -6)
            assert all(numpy.array_equal(g, p.grad) for g in comm.allgather(p.grad)), (it, n)
    if comm.size > 1:
        tuner = ov.tuning.tuner
        assert 3 <= tuner.history[0][0] <= 10 and list(tuner.history[0][1]) == ['dtype']
        assert sorted(tuner.history[0][1]['dtype']) == ['float16', 'float32']
        assert ov.tuning.dtype in (None, numpy.dtype(numpy.float16))
    ov.free()
