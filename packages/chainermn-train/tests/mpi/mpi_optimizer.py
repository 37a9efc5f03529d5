"""Multi-node optimizer on every rank: equivalence with single-process training (run under mpiexec)."""

import copy
import os
import re
import sys

import chainer
import chainer.functions as F
import numpy
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _common  # noqa: E402

import chainermn_comm  # noqa: E402
import chainermn_train  # noqa: E402

B = 3      # per-rank batch
ITERS = 5


def _batches(size, rank, iters=ITERS, b=B):
    x, y = _common.data(size * b * iters, seed=1)
    for k in range(iters):
        g0 = k * size * b
        yield (x[g0 + rank * b:g0 + (rank + 1) * b], y[g0 + rank * b:g0 + (rank + 1) * b],
               x[g0:g0 + size * b], y[g0:g0 + size * b])


def _optimizers():
    def momentum_wd():
        o = chainer.optimizers.MomentumSGD(lr=0.05, momentum=0.9)
        return o, [chainer.optimizer_hooks.WeightDecay(1e-2)]
    return {
        'sgd': lambda: (chainer.optimizers.SGD(lr=0.1), []),
        'adam': lambda: (chainer.optimizers.Adam(alpha=0.01), []),
        'momentum_wd': momentum_wd,
    }


def _run(kind, lazy=False, precomputed=False, overlap=False):
    comm = _common.comm()
    make = _optimizers()[kind]
    model = _common.make_model(100 + comm.rank, lazy=lazy)   # different init on every rank
    ref = _common.make_model(100, lazy=lazy)                  # rank 0's init
    opt, hooks = make()
    mopt = chainermn_train.create_multi_node_optimizer(opt, comm, overlap=overlap)
    mopt.setup(model)
    for h in hooks:
        mopt.add_hook(h)
    ropt, rhooks = make()
    ropt.setup(ref)
    for h in rhooks:
        ropt.add_hook(h)
    init = None if lazy else _common.params_of(ref)
    calls = [0]

    def counted(x, y):
        calls[0] += 1
        return _common.loss_fn(model)(x, y)

    for k, (x, y, gx, gy) in enumerate(_batches(comm.size, comm.rank)):
        if lazy and k == 0:   # lazy parameters are drawn at the first forward pass
            numpy.random.seed(200 + comm.rank)
        if precomputed:
            model.cleargrads()
            F.mean_squared_error(model(x), y).backward()
            mopt.update()
        else:
            mopt.update(counted, x, y)
            assert calls[0] == k + 1   # the loss function runs once per update, the first included
        if lazy and k == 0:
            # The first forward pass created the parameters: the multi-node optimizer took
            # rank 0's values and skipped this update; the reference only initialises them.
            numpy.random.seed(200)
            ref(gx)
        else:
            ropt.update(_common.loss_fn(ref), gx, gy)
        got, want = _common.params_of(model), _common.params_of(ref)
        assert sorted(got) == sorted(want)
        for name in want:
            numpy.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12,
                                          err_msg='{} iteration {} param {}'.format(kind, k, name))
        if k == 0 and init is not None:   # the first update was not lost
            assert any(not numpy.array_equal(init[n], got[n]) for n in got)
    assert mopt.t == ropt.t == (ITERS - 1 if lazy else ITERS)
    return mopt


@pytest.mark.parametrize('kind', ['sgd', 'adam', 'momentum_wd'])
def test_equivalence(kind):
    _run(kind)


@pytest.mark.parametrize('kind', ['sgd', 'adam'])
def test_equivalence_lazy_link(kind):
    _run(kind, lazy=True)


def test_equivalence_precomputed_grads():
    _run('adam', precomputed=True)


def test_overlap_path_uses_backward_overlap():
    stub = _common.install_overlap_stub()
    mopt = _run('sgd', overlap=True)
    assert mopt._overlap is not None
    if stub:
        assert mopt._overlap.calls == ITERS


def test_delegation_and_serialize():
    comm = _common.comm()
    model = _common.make_model(7)
    mopt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.3), comm)
    mopt.setup(model)
    assert mopt.lr == 0.3 and mopt.actual_optimizer.lr == 0.3
    mopt.lr = 0.01
    assert mopt.actual_optimizer.lr == 0.01
    assert mopt.target is model
    mopt.add_hook(chainer.optimizer_hooks.WeightDecay(1e-3))
    assert 'WeightDecay' in mopt.actual_optimizer._hookable._pre_update_hooks
    x, y = _common.data(4, seed=comm.rank)
    mopt.update(_common.loss_fn(model), x, y)
    state = {}
    ser = chainer.serializers.DictionarySerializer(state)
    mopt.serialize(ser)
    assert int(state['t']) == 1
    fresh = chainermn_train.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.3), comm)
    fresh.setup(copy.deepcopy(model))
    fresh.serialize(chainer.serializers.NpzDeserializer(state))
    assert fresh.t == 1   # Chainer serializes t, epoch and per-parameter states (not hyperparameters)
    # parameters were broadcast from rank 0 at setup: identical on every rank
    for name, p in sorted(model.namedparams()):
        arrays = comm.allgather(p.array)
        for a in arrays:
            assert numpy.array_equal(a, arrays[0]), name


def test_double_buffering_trajectory():
    comm = _common.comm()
    model = _common.make_model(100 + comm.rank)
    ref = _common.make_model(100)
    lr = 0.1
    mopt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(lr=lr), comm,
                                                       double_buffering=True)
    mopt.setup(model)
    prev_grads = None
    for k, (x, y, gx, gy) in enumerate(_batches(comm.size, comm.rank, iters=6)):
        # reference: the gradient of iteration k at the current reference parameters
        ref.cleargrads()
        _common.loss_fn(ref)(gx, gy).backward()
        grads = {n: p.grad.copy() for n, p in ref.namedparams()}
        use = grads if k == 0 else prev_grads   # update k uses iteration k-1's gradient
        for n, p in ref.namedparams():
            p.array -= lr * use[n]
        prev_grads = grads
        mopt.update(_common.loss_fn(model), x, y)
        got, want = _common.params_of(model), _common.params_of(ref)
        for name in want:
            numpy.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12,
                                          err_msg='iteration {} param {}'.format(k, name))
    mopt.finish()


def test_double_buffering_float16_wire_gives_the_plain_bits():
    # Gradients of 1e-7 are float16 subnormals unless scaled: double buffering must scale and
    # cast per array as the plain path does, not cast its host copy unscaled.
    from chainermn_train._double_buffer import DoubleBufferingReducer
    base = _common.comm()
    comm = chainermn_comm.create_communicator('naive', mpi_comm=base.mpi_comm,
                                              allreduce_grad_dtype=numpy.float16)
    models = [_common.make_model(7), _common.make_model(7)]
    rng = numpy.random.RandomState(comm.rank)
    for p in models[0].params():
        p.grad = (rng.standard_normal(p.array.shape) * 1e-7).astype(p.array.dtype)
    for pa, pb in zip(models[0].params(), models[1].params()):
        pb.grad = pa.grad.copy()
    DoubleBufferingReducer(comm).swap(models[0])  # the first swap averages at once
    comm.multi_node_mean_grad(models[1])
    for (name, pa), (_, pb) in zip(sorted(models[0].namedparams()), sorted(models[1].namedparams())):
        assert pa.grad.dtype == pa.array.dtype, name
        assert numpy.array_equal(pa.grad, pb.grad), name
        if comm.size > 1:
            assert numpy.count_nonzero(pa.grad) == pa.grad.size, name


def test_different_models_on_the_ranks_raise_everywhere():
    """Two ranks holding different parts of a model have nothing to average: a clear error."""
    comm = _common.comm()
    model = _common.MLP(4, n_hidden=5 if comm.rank == 0 else 6)
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
    if comm.size == 1:
        opt.setup(model)
        return
    with pytest.raises(ValueError, match=r'(?s)hold other parameters than its rank 0.*'
                                         r'comm.split\(part_index') as e:
        opt.setup(model)
    if comm.rank == 0:
        assert 'this rank: the same as rank 0' in str(e.value)
    else:
        assert re.search(r'has /l1/W \(6, 4\) <f[48] where rank 0 has /l1/W \(5, 4\) <f[48]',
                         str(e.value)), str(e.value)
    # The ranks are still in step: the same communicator works afterwards.
    assert comm.allreduce_obj(1) == comm.size


class _TwoBatchUpdater(chainer.training.updaters.StandardUpdater):
    """Like Chainer's ptb BPTTUpdater: add up the loss of two batches, backward once, update() once."""

    def update_core(self):
        iterator, optimizer = self.get_iterator('main'), self.get_optimizer('main')
        loss = 0
        for _ in range(2):
            x, y = self.converter(next(iterator), self.device)
            loss += F.mean_squared_error(optimizer.target(x), y)
        optimizer.target.cleargrads()
        loss.backward()
        optimizer.update()


@pytest.mark.parametrize('clip', [None, 1e-3])
def test_custom_updater_and_hook_follow_one_process(clip):
    """Issue 44 (docs/converting.md): a custom updater calling ``update()`` and a gradient hook.

    GradientClipping is not linear: clipping each rank's own gradient before the average would
    leave the trajectory of one process that clips the gradient of the global batch.
    """
    comm = _common.comm()
    model = _common.make_model(100 + comm.rank)
    ref = _common.make_model(100)
    mopt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm)
    mopt.setup(model)
    ropt = chainer.optimizers.SGD(lr=0.1)
    ropt.setup(ref)
    if clip is not None:
        mopt.add_hook(chainer.optimizer_hooks.GradientClipping(clip))
        ropt.add_hook(chainer.optimizer_hooks.GradientClipping(clip))
    mine, everyone = [], []
    for x, y, gx, gy in _batches(comm.size, comm.rank, iters=6):
        mine += list(zip(x, y))
        everyone += list(zip(gx, gy))
    updater = _TwoBatchUpdater(chainer.iterators.SerialIterator(mine, B, shuffle=False), mopt)
    reference = _TwoBatchUpdater(chainer.iterators.SerialIterator(everyone, B * comm.size, shuffle=False),
                                 ropt)
    for k in range(3):
        updater.update()
        reference.update()
        got, want = _common.params_of(model), _common.params_of(ref)
        for name in want:
            numpy.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12,
                                          err_msg='clip {} update {} param {}'.format(clip, k, name))
    assert mopt.t == ropt.t == 3
