"""Per-rank tests of communication hooks (run under mpiexec by test_hooks_mpi.py).

Built-in wire hooks equal the communicator's own average bit for bit; PowerSGD leaves the same
bits on every rank, reproduces the exact average at full rank, keeps error feedback, and its
state survives a save and load; a hook of the user's own works.
"""

import chainer
import chainer.links as L
import numpy
import pytest
from mpi4py import MPI

import chainermn_comm
from chainermn_comm import hooks

COMM = MPI.COMM_WORLD
SHAPES = {'a': (12, 5), 'b': (5,), 'c': (6, 3, 2, 2), 'd': (4, 6), 'e': ()}


class Model(chainer.Chain):
    """Parameters of several shapes: matrices, a 4-d kernel, a vector and a scalar."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            for name, shape in SHAPES.items():
                setattr(self, name, chainer.Parameter(numpy.zeros(shape, numpy.float32)))


def _grads(model, seed, scale=1.0):
    """Give ``model`` gradients that depend on this rank and ``seed``."""
    rng = numpy.random.RandomState(1000 * seed + COMM.Get_rank())
    for name, p in sorted(model.namedparams()):
        p.grad = numpy.asarray(rng.standard_normal(p.array.shape) * scale, dtype=numpy.float32)


def _snapshot(model):
    return {n: p.grad.copy() for n, p in sorted(model.namedparams())}


def _same_everywhere(arrays):
    """Assert every rank holds the same bits in ``arrays`` (a dict of arrays)."""
    mine = numpy.concatenate([a.reshape(-1).view(numpy.uint32) for _, a in sorted(arrays.items())])
    rows = COMM.allgather(mine)
    for r, row in enumerate(rows):
        assert numpy.array_equal(row, rows[0]), 'rank {} differs from rank 0'.format(r)


@pytest.mark.parametrize('wire,hook', [(None, hooks.Exact), (numpy.float16, hooks.Float16),
                                       ('bfloat16', hooks.BFloat16), (numpy.float64, None)])
def test_builtin_wires_equal_the_communicators_own_average(wire, hook):
    own = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=wire)
    plain = chainermn_comm.create_communicator('naive')
    model = Model()
    hook = hook() if hook is not None else hooks.from_grad_dtype(wire)
    assert hook.is_wire and str(hook) == {None: 'exact'}.get(wire, hook.name)
    for seed in range(4):
        _grads(model, seed)
        own.multi_node_mean_grad(model)
        want = _snapshot(model)
        _grads(model, seed)
        hooks.mean_model(plain, model, hook)  # a communicator without that wire: the hook's wire
        got = _snapshot(model)
        for name in want:
            assert got[name].tobytes() == want[name].tobytes(), (name, seed)
    own.finalize()
    plain.finalize()


def test_auto_hook_is_one_of_the_wires_bit_for_bit():
    comm = chainermn_comm.create_communicator('naive')
    model = Model()
    hook = hooks.Auto()
    assert hook.is_wire and hook.wire == 'auto'
    for seed in range(12):  # the tuner's warm-up and schedule try every wire
        wants = []
        for wire in (None, numpy.float16, 'bfloat16'):
            _grads(model, seed)
            hooks.mean_model(comm, model, hooks.from_grad_dtype(wire))
            wants.append(_snapshot(model))
        _grads(model, seed)
        hooks.mean_model(comm, model, hook)
        got = _snapshot(model)
        assert any(all(got[n].tobytes() == w[n].tobytes() for n in got) for w in wants), seed
    comm.finalize()


def test_user_hooks_class_and_function():
    comm = chainermn_comm.create_communicator('naive')
    model = Model()

    class Float64Mean(hooks.CommHook):
        name = 'float64-mean'

        def __init__(self):
            self.calls = 0

        def __call__(self, comm, bucket):
            self.calls += 1
            wide = [g.astype(numpy.float64) for g in bucket.grads]
            hooks.mean(comm, wide)
            for g, w in zip(bucket.grads, wide):
                g[...] = w

    seen = []

    def by_function(comm, bucket):
        seen.append((bucket.index, bucket.count, tuple(bucket.names)))
        hooks.mean(comm, bucket.grads, wire=numpy.float64)

    for hook in (Float64Mean(), by_function):
        _grads(model, 3)
        want = {}
        for name, p in sorted(model.namedparams()):
            rows = COMM.allgather(p.grad.astype(numpy.float64))
            want[name] = (sum(rows) / COMM.Get_size()).astype(numpy.float32)
        hooks.mean_model(comm, model, hooks.resolve(hook))
        for name, p in sorted(model.namedparams()):
            numpy.testing.assert_allclose(p.grad, want[name], rtol=1e-6, atol=1e-7)
    assert seen == [(0, 1, tuple(sorted(n for n, _ in model.namedparams())))]
    comm.finalize()


def test_powersgd_same_bits_on_every_rank_and_compresses_matrices_only():
    comm = chainermn_comm.create_communicator('naive')
    model = Model()
    hook = hooks.PowerSGD(rank=2, start_update=1, min_compression=1.0)
    for seed in range(5):
        _grads(model, seed)
        before = _snapshot(model)
        hooks.mean_model(comm, model, hook)
        after = _snapshot(model)
        _same_everywhere(after)
        if seed == 0:  # before start_update: exact
            for name in after:
                rows = COMM.allgather(before[name])
                numpy.testing.assert_allclose(after[name], sum(rows) / COMM.Get_size(), rtol=1e-5,
                                              atol=1e-6)
        else:
            # /a, /c, /d are matrices (c as 6 x 12): rank 2 of them; /b and /e are averaged exactly.
            assert hook.last['compressed'] == 3 and hook.last['exact'] == 2, hook.last
            for name in ('/a', '/c', '/d'):
                n = SHAPES[name[1:]][0]
                assert numpy.linalg.matrix_rank(after[name].reshape(n, -1), tol=1e-4) <= 2
            for name in ('/b', '/e'):
                rows = COMM.allgather(before[name])
                numpy.testing.assert_allclose(after[name], sum(rows) / COMM.Get_size(), rtol=1e-5,
                                              atol=1e-6)
    assert hook.updates == 5
    comm.finalize()


def test_powersgd_ranks_agree_on_what_runs_the_host_products(monkeypatch):
    """Compiled products only where every rank has them: one rank without makes all use NumPy."""
    import importlib.util
    have_numba = importlib.util.find_spec('numba') is not None
    import logging
    comm = chainermn_comm.create_communicator('naive')
    results = {}
    said = []
    catcher = logging.Handler()
    catcher.emit = lambda record: said.append(record.getMessage())
    logging.getLogger('chainermn.hooks').addHandler(catcher)
    for off in (True, False):
        if off and COMM.Get_rank() == 0:
            monkeypatch.setenv('CHAINERMN_POWERSGD_JIT', '0')
        else:
            monkeypatch.delenv('CHAINERMN_POWERSGD_JIT', raising=False)
        model = Model()
        hook = hooks.PowerSGD(rank=2, start_update=0, min_compression=1.0)
        for seed in range(3):
            _grads(model, seed)
            hooks.mean_model(comm, model, hook)
            _same_everywhere(_snapshot(model))
        want = 'numpy' if off or not have_numba else 'numba'
        assert hook.host_products == {'<f4': want}, hook.host_products
        results[want] = _snapshot(model)
        # One line, on rank 0, where some ranks could have compiled them and one could not.
        if off and have_numba and COMM.Get_size() > 1 and COMM.Get_rank() == 0:
            assert said == ['PowerSGD runs its host products with NumPy and BLAS on every rank: '
                            'rank 0: CHAINERMN_POWERSGD_JIT=0'], said
        else:
            assert said == [], said
        del said[:]
    logging.getLogger('chainermn.hooks').removeHandler(catcher)
    if len(results) == 2:  # the two kinds of products: the same average within float rounding
        for name, grad in results['numpy'].items():
            numpy.testing.assert_allclose(results['numba'][name], grad, rtol=1e-3, atol=1e-4)
    comm.finalize()


def test_powersgd_at_full_rank_is_the_exact_average():
    comm = chainermn_comm.create_communicator('naive')
    model = Model()
    # rank 6 >= min(rows, columns) of every matrix: the approximation is the matrix itself.
    hook = hooks.PowerSGD(rank=6, start_update=0, min_compression=0.01)
    for seed in range(4):
        _grads(model, seed)
        before = _snapshot(model)
        hooks.mean_model(comm, model, hook)
        assert hook.last['compressed'] == 3
        for name, p in sorted(model.namedparams()):
            rows = COMM.allgather(before[name].astype(numpy.float64))
            numpy.testing.assert_allclose(p.grad, sum(rows) / COMM.Get_size(), rtol=2e-4, atol=2e-5,
                                          err_msg='{} at update {}'.format(name, seed))
    comm.finalize()


def test_powersgd_error_feedback_keeps_what_was_left_out():
    comm = chainermn_comm.create_communicator('naive')
    model = Model()
    hook = hooks.PowerSGD(rank=1, start_update=0)
    _grads(model, 7)
    before = _snapshot(model)
    hooks.mean_model(comm, model, hook)
    after = _snapshot(model)
    # Each rank's memory is its own gradient minus the shared approximation.
    for name in ('/a',):
        numpy.testing.assert_allclose(hook._error[name].reshape(-1), (before[name] - after[name]).reshape(-1),
                                      rtol=1e-5, atol=1e-6)
    # Without error feedback nothing is kept.
    plain = hooks.PowerSGD(rank=1, start_update=0, error_feedback=False)
    _grads(model, 7)
    hooks.mean_model(comm, model, plain)
    assert plain._error == {}
    comm.finalize()


def test_powersgd_state_saved_and_loaded_continues_bit_for_bit():
    comm = chainermn_comm.create_communicator('naive')
    model = Model()
    a = hooks.PowerSGD(rank=2, start_update=1)
    for seed in range(3):
        _grads(model, seed)
        hooks.mean_model(comm, model, a)
    ser = chainer.serializers.DictionarySerializer()
    a.serialize(ser)
    keys = sorted(ser.target)
    assert keys == ['error_names', 'error_shapes', 'names', 'q', 'q_shapes', 'rank_mean/error',
                    'updates'], keys
    b = hooks.PowerSGD(rank=2, start_update=1)
    empty = chainer.serializers.DictionarySerializer()
    b.serialize(empty)
    assert empty.target == {}  # nothing to save before the first call
    b.serialize(chainer.serializers.NpzDeserializer(ser.target))
    assert b.updates == 3
    for seed in range(3, 6):
        _grads(model, seed)
        hooks.mean_model(comm, model, a)
        want = _snapshot(model)
        _grads(model, seed)
        hooks.mean_model(comm, model, b)
        got = _snapshot(model)
        for name in want:
            assert got[name].tobytes() == want[name].tobytes(), (name, seed)
    # A snapshot without the hook's keys leaves a fresh state.
    c = hooks.PowerSGD()
    c.serialize(chainer.serializers.NpzDeserializer({'other': numpy.zeros(1)}))
    assert c.updates == 0
    comm.finalize()


def test_powersgd_with_a_bfloat16_exact_wire():
    comm = chainermn_comm.create_communicator('naive')
    model = Model()
    hook = hooks.PowerSGD(rank=2, start_update=0, exact_wire='bfloat16')
    _grads(model, 2)
    ref = Model()
    _grads(ref, 2)
    hooks.mean_model(comm, model, hook)
    # The vector and the scalar took the bfloat16 wire: the same bits as BFloat16 on those two.
    hooks.mean(comm, [ref.b.grad, ref.e.grad], 'bfloat16')
    assert model.b.grad.tobytes() == ref.b.grad.tobytes()
    assert model.e.grad.tobytes() == ref.e.grad.tobytes()
    comm.finalize()


def test_hook_arguments_are_checked():
    with pytest.raises(ValueError, match='rank'):
        hooks.PowerSGD(rank=0)
    with pytest.raises(ValueError, match='start_update'):
        hooks.PowerSGD(start_update=-1)
    with pytest.raises(TypeError, match='instance'):
        hooks.resolve(hooks.PowerSGD)
    with pytest.raises(TypeError, match='comm_hook'):
        hooks.resolve(3)
    with pytest.raises(ValueError, match='allreduce_grad_dtype'):
        hooks.resolve('int8')


def test_auto_with_powersgd_tunes_the_wire_then_against_powersgd():
    comm = chainermn_comm.create_communicator('naive')
    model = Model()
    psgd = hooks.PowerSGD(rank=2, start_update=2, min_compression=1.0)
    auto = hooks.Auto(powersgd=psgd)
    assert not auto.is_wire and str(auto) == 'auto+powersgd-r2'
    started = None
    for seed in range(32):
        _grads(model, seed)
        hooks.mean_model(comm, model, auto)
        _same_everywhere(_snapshot(model))
        if started is None and auto._tuning is not None:
            started = seed + 1  # the update that warmed PowerSGD up
            assert started >= 3 and comm._wire_tuned('auto')  # after start_update and the wire's schedule
            assert psgd.updates == 3  # compressed at once (start_update counted as passed)
    assert started is not None and auto._tuning.tuner.calls == 32 - started + 1
    if COMM.Get_size() > 1:
        history = auto._tuning.tuner.history
        assert history and sorted(history[0][1]['hook']) == ['auto', 'powersgd-r2']
    assert auto.choice in (auto._auto_wire, psgd)
    ser = chainer.serializers.DictionarySerializer()
    auto.serialize(ser)
    assert 'powersgd/rank_mean/error' in ser.target and int(ser.target['powersgd/updates']) >= 3
    comm.finalize()


class Model16(chainer.Chain):
    """A float16 matrix (compressed) and a float16 vector (averaged exactly)."""

    def __init__(self, dtype=numpy.float16):
        super().__init__()
        with self.init_scope():
            self.w = chainer.Parameter(numpy.zeros((64, 48), dtype))
            self.b = chainer.Parameter(numpy.zeros((48,), dtype))


def test_powersgd_float16_gradients_near_the_maximum_stay_finite():
    """Factors and error memory in float32, the result written back in float16 (issue 55 item 3)."""
    comm = chainermn_comm.create_communicator('naive')
    model, ref = Model16(), Model16(numpy.float32)
    hook = hooks.PowerSGD(rank=2, start_update=0, min_compression=1.0)
    ref_hook = hooks.PowerSGD(rank=2, start_update=0, min_compression=1.0)
    top = float(numpy.finfo(numpy.float16).max)
    for step in range(3):
        rng = numpy.random.RandomState(100 * step + COMM.Get_rank())
        for name, p in sorted(model.namedparams()):
            p.grad = (rng.uniform(-1.0, 1.0, p.array.shape) * 60000.0).astype(numpy.float16)
            getattr(ref, name.lstrip('/')).grad = p.grad.astype(numpy.float32)
        hooks.mean_model(comm, model, hook)
        hooks.mean_model(comm, ref, ref_hook)
        got = _snapshot(model)
        for name, g in got.items():
            assert g.dtype == numpy.float16 and numpy.isfinite(g).all(), (name, step)
            assert numpy.abs(g).max() > 1000.0, (name, step)  # not flushed to zero either
        err = hook._error['/w']
        assert err.dtype == numpy.float32 and numpy.isfinite(err).all(), step
        _same_everywhere({n: g.view(numpy.uint16).astype(numpy.uint32) for n, g in got.items()})
        if step == 0:  # the same factors as on float32 gradients, written back in float16
            want = numpy.clip(ref.w.grad, -top, top).astype(numpy.float16)
            if COMM.Get_size() <= 2:
                assert got['/w'].tobytes() == want.tobytes()
            else:
                numpy.testing.assert_allclose(got['/w'], want, rtol=1e-2, atol=64.0)
    comm.finalize()


def test_a_collective_called_inside_a_hook_raises_a_clear_error():
    """A hook runs inside the average's checked call: the communicator's collectives refuse (issue 55 item 9)."""
    comm = chainermn_comm.create_communicator('naive')
    model = Model()

    def chatty(c, bucket):
        c.allreduce(numpy.ones(3, numpy.float32))

    _grads(model, 0)
    with pytest.raises(chainermn_comm.CommunicationError,
                       match=r"rank \d+: the communication hook .*chatty.* called the communicator's "
                             r"allreduce\(\); .*chainermn.hooks.mean\(comm, arrays\)"):
        hooks.mean_model(comm, model, hooks.resolve(chatty))

    def nested(c, bucket):
        c.multi_node_mean_grad(model)

    _grads(model, 0)
    with pytest.raises(chainermn_comm.CommunicationError,
                       match=r"the communication hook .*nested.* called the communicator's allreduce_grad\(\)"):
        hooks.mean_model(comm, model, hooks.resolve(nested))
    # Outside the hook the communicator works as before, and hooks.mean inside a hook too.
    assert comm.allreduce(numpy.ones(2, numpy.float32)).tolist() == [COMM.Get_size()] * 2

    def polite(c, bucket):
        hooks.mean(c, bucket.grads)

    _grads(model, 1)
    hooks.mean_model(comm, model, hooks.resolve(polite))
    _same_everywhere(_snapshot(model))
    comm.finalize()


def test_a_dropped_communicator_is_freed_at_once():
    """No reference cycle through the averaging interface: a dropped communicator goes at once.

    Otherwise the garbage collector would free it (and its MPI resources) later, at a moment
    that differs between ranks.
    """
    import gc
    import weakref
    gc.disable()
    try:
        comm = chainermn_comm.create_communicator('naive')
        model = Model()
        _grads(model, 0)
        hooks.mean_model(comm, model, hooks.resolve(lambda c, bucket: hooks.mean(c, bucket.grads)))
        refs = [weakref.ref(comm), weakref.ref(comm.averaging)]
        del comm
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()
