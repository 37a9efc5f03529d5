"""Per-rank tests of shard_state=True (run by test_sharded_mpi.py at 1, 2 and 3 ranks)."""

import hashlib
import os

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest
from chainer import optimizer_hooks as H

import chainermn_comm
from chainermn_comm import hooks
from chainermn_train import create_multi_node_optimizer
from chainermn_train import _sharded

_comm = []


def comm():
    if not _comm:
        _comm.append(chainermn_comm.create_communicator('naive'))
    return _comm[0]


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(6, 16)
            self.l2 = L.Linear(16, 8)
            self.l3 = L.Linear(8, 3)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


class CNN(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(1, 4, 3, nobias=True)  # a bias before BN gets a zero-mean gradient that Adam amplifies
            self.bn = L.BatchNormalization(4)
            self.fc = L.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.c1(x))))


class Tiny(chainer.Link):
    """Fewer parameters than ranks, one of them empty: unequal and empty shares."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.empty = chainer.Parameter(numpy.zeros((0,), numpy.float32))
            self.w = chainer.Parameter(numpy.linspace(-1, 1, 5).astype(numpy.float32))

    def forward(self, x):
        return F.sum(x[:, :5] * F.broadcast_to(self.w, x[:, :5].shape))  # self.empty: no gradient


def make(kind, seed=0):
    numpy.random.seed(seed)
    with chainer.using_config('dtype', numpy.float32):
        return {'mlp': MLP, 'cnn': CNN, 'tiny': Tiny}[kind]()


def batch(kind, it, rank):
    rs = numpy.random.RandomState(1000 * it + rank)
    if kind == 'cnn':
        x = rs.standard_normal((4, 1, 6, 6)).astype(numpy.float32)
    else:
        x = rs.standard_normal((4, 6)).astype(numpy.float32)
    return x, rs.randint(0, 3, size=4).astype(numpy.int32)


def make_opt(config):
    if config == 'adam':
        opt = chainer.optimizers.Adam(alpha=0.01)
        return opt, [H.WeightDecay(1e-3), H.GradientClipping(0.5)]
    if config == 'momentum':
        return chainer.optimizers.MomentumSGD(lr=0.05), []
    if config == 'sgd_hooks':
        return chainer.optimizers.MomentumSGD(lr=0.05), [
            H.Lasso(1e-3), H.GradientHardClipping(-0.05, 0.05), H.GradientLARS(threshold=1e-2)]
    raise ValueError(config)


def train(kind, config, shard, steps=30, comm_hook=None, overlap=False):
    c = comm()
    model = make(kind)
    opt, hook_list = make_opt(config)
    mn = create_multi_node_optimizer(opt, c, shard_state=shard, comm_hook=comm_hook, overlap=overlap)
    mn.setup(model)
    for h in hook_list:
        mn.add_hook(h)
    for it in range(steps):
        x, t = batch(kind, it, c.rank)
        if kind == 'tiny':
            mn.update(lambda a: model(a), x)
        else:
            mn.update(lambda a, b: F.softmax_cross_entropy(model(a), b), x, t)
        if it == 10:
            mn.new_epoch()
    return model, mn


def digest(model):
    h = hashlib.sha256()
    for n, p in sorted(model.namedparams()):
        h.update(n.encode())
        h.update(numpy.ascontiguousarray(p.array).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize('kind,config', [('mlp', 'adam'), ('mlp', 'momentum'), ('cnn', 'adam'),
                                         ('cnn', 'momentum'), ('mlp', 'sgd_hooks'), ('tiny', 'adam')])
def test_same_as_unsharded_and_bitwise_on_every_rank(kind, config):
    c = comm()
    ref, ref_opt = train(kind, config, False)
    got, opt = train(kind, config, True)
    for (n, a), (_, b) in zip(sorted(ref.namedparams()), sorted(got.namedparams())):
        scale = max(1e-3, float(numpy.abs(a.array).max()) if a.array.size else 1.0)
        # GradientLARS and Lasso scale each step by norms and signs, which turn the last-bit
        # differences of another summation order (reduce-scatter vs all-reduce) into a few ulps
        # more per update: 1e-5 there (seen 2.5e-6 on NumPy 2 at 2x2 nodes), 1e-6 elsewhere.
        tol = 1e-5 if config == 'sgd_hooks' else 1e-6
        numpy.testing.assert_allclose(b.array, a.array, rtol=tol, atol=tol * scale, err_msg=n)
    assert len(set(c.allgather_obj(digest(got)))) == 1
    assert opt.t == ref_opt.t == 30 and opt.epoch == ref_opt.epoch == 1
    assert c.allgather_obj((opt.t, opt.epoch)) == [(30, 1)] * c.size
    # Each rank holds only its share of the state; the others' is never allocated.
    shard = opt._mn_shard
    for p, r in zip(shard.params, shard.owners):
        if r != c.rank:
            assert p.update_rule.state is None and p.update_rule.t == 0
        else:
            assert p.update_rule.t == 30 or config != 'adam'
    total = _sharded.state_bytes(ref_opt)
    largest = max([0] + [sum(v.nbytes for v in (p.update_rule.state or {}).values())
                         for p in ref.params()])
    mine = _sharded.state_bytes(opt)
    assert mine <= total / c.size + largest
    assert sum(c.allgather_obj(mine)) == total


@pytest.mark.parametrize('kind,config', [('mlp', 'adam'), ('cnn', 'momentum'), ('tiny', 'adam')])
def test_overlap_reduce_scatters_buckets(kind, config):
    # CHAINERMN_OVERLAP_MODE (set by the launcher: thread, inline or end) says when the buckets go;
    # small buckets (CHAINERMN_OVERLAP_BUCKET_BYTES) make several per model.
    c = comm()
    ref, _ = train(kind, config, False, steps=12)
    got, opt = train(kind, config, True, steps=12, overlap=True)
    assert opt._mn_shard is not None and opt._overlap is not None
    for (n, a), (_, b) in zip(sorted(ref.namedparams()), sorted(got.namedparams())):
        scale = max(1e-3, float(numpy.abs(a.array).max()) if a.array.size else 1.0)
        numpy.testing.assert_allclose(b.array, a.array, rtol=1e-6, atol=1e-6 * scale, err_msg=n)
    assert len(set(c.allgather_obj(digest(got)))) == 1
    shard = opt._mn_shard
    for p, r in zip(shard.params, shard.owners):
        assert (p.update_rule.state is None) == (r != c.rank) or config != 'adam'
    mode = os.environ.get('CHAINERMN_OVERLAP_MODE')
    if mode in ('thread', 'inline') and c.size > 1 and kind != 'tiny':
        assert opt._overlap.mode == mode and opt._overlap.early_params > 0


def test_partition_is_balanced_and_deterministic():
    sizes = [100, 7, 0, 50, 50, 3, 3, 0, 1000]
    for n in (1, 2, 3, 4, 12):
        owners = _sharded.partition(sizes, n)
        assert owners == _sharded.partition(list(sizes), n)
        loads = [sum(s for s, r in zip(sizes, owners) if r == k) for k in range(n)]
        assert max(loads) <= sum(sizes) / n + max(sizes)
        assert sorted(set(owners)) <= list(range(n))
    assert _sharded.partition([5, 5, 5, 5], 2) == [0, 1, 0, 1]


def test_refusals_name_the_option():
    c = comm()
    with pytest.raises(ValueError, match='double_buffering=True is refused'):
        create_multi_node_optimizer(chainer.optimizers.SGD(), c, double_buffering=True, shard_state=True)
    # overlap=True reduce-scatters its buckets to the owners (test_overlap_reduce_scatters_buckets).
    assert create_multi_node_optimizer(chainer.optimizers.SGD(), c, overlap=True, shard_state=True).overlap
    with pytest.raises(ValueError, match='PowerSGD'):
        create_multi_node_optimizer(chainer.optimizers.SGD(), c, comm_hook=hooks.PowerSGD(rank=2),
                                    shard_state=True)
    with pytest.raises(ValueError, match='has no reduce-scatter'):
        create_multi_node_optimizer(chainer.optimizers.SGD(), object(), shard_state=True)
    # A built-in wire is taken as the reduce-scatter's wire.
    opt = create_multi_node_optimizer(chainer.optimizers.SGD(), c, comm_hook=hooks.BFloat16(),
                                      shard_state=True)
    assert opt._mn_shard.wire == 'bfloat16' and opt.shard_state


def test_whole_model_hook_is_refused_naming_it():
    c = comm()
    model = make('mlp')

    def my_global_hook(opt):
        pass

    my_global_hook.name = 'my_global_hook'
    mn = create_multi_node_optimizer(chainer.optimizers.SGD(), c, shard_state=True).setup(model)
    with pytest.raises(ValueError, match='my_global_hook'):
        mn.add_hook(my_global_hook)   # refused when it is added
    mn.add_hook(H.WeightDecay(1e-4))
    mn.actual_optimizer.add_hook(my_global_hook)   # added behind the wrapper's back
    x, t = batch('mlp', 0, c.rank)
    with pytest.raises(ValueError, match='my_global_hook'):
        mn.update(lambda a, b: F.softmax_cross_entropy(model(a), b), x, t)
    # Wrapping an optimizer that already has such a hook is refused when it is made.
    inner = chainer.optimizers.SGD().setup(make('mlp'))
    inner.add_hook(my_global_hook)
    with pytest.raises(ValueError, match='my_global_hook'):
        create_multi_node_optimizer(inner, c, shard_state=True)


def _nan_step(shard, dynamic, check_finite=None):
    c = comm()
    model = make('mlp')
    opt = chainer.optimizers.Adam(alpha=0.01)
    if dynamic:
        opt.loss_scaling()
    mn = create_multi_node_optimizer(opt, c, shard_state=shard, check_finite=check_finite).setup(model)
    for it in range(3):
        x, t = batch('mlp', it, c.rank)
        model.cleargrads()
        F.softmax_cross_entropy(model(x), t).backward()
        if it == 1 and c.rank == c.size - 1:
            model.l3.b.grad[0] = numpy.nan  # one rank, one parameter
        with _no_check():
            mn.update()
    return model, mn


class _no_check:
    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter('ignore')

    def __exit__(self, *a):
        self._w.__exit__(*a)


@pytest.mark.parametrize('dynamic,check_finite', [(True, None), (False, 'skip'), (True, 'skip')])
def test_non_finite_skips_on_every_rank(dynamic, check_finite):
    c = comm()
    ref, ref_opt = _nan_step(False, dynamic, check_finite)
    got, opt = _nan_step(True, dynamic, check_finite)
    for (n, a), (_, b) in zip(sorted(ref.namedparams()), sorted(got.namedparams())):
        numpy.testing.assert_allclose(b.array, a.array, rtol=1e-6, atol=1e-7, err_msg=n)
        assert numpy.isfinite(b.array).all()
    assert len(set(c.allgather_obj(digest(got)))) == 1
    assert opt.t == ref_opt.t
    if dynamic:
        assert opt._loss_scale == ref_opt._loss_scale
    if check_finite == 'skip':
        assert opt.skipped_updates == ref_opt.skipped_updates == 1


def _continue(kind, config, shard, saved, start, steps):
    """Make a fresh model and optimizer, load ``saved`` (params and optimizer), run updates start..steps-1."""
    c = comm()
    model = make(kind, seed=99)  # other initial values: the snapshot must overwrite them
    opt, hook_list = make_opt(config)
    mn = create_multi_node_optimizer(opt, c, shard_state=shard)
    mn.setup(model)
    for h in hook_list:
        mn.add_hook(h)
    chainer.serializers.load_npz(saved['model'], model)
    chainer.serializers.load_npz(saved['opt'], mn)
    for it in range(start, steps):
        x, t = batch(kind, it, c.rank)
        mn.update(lambda a, b: F.softmax_cross_entropy(model(a), b), x, t)
    return model, mn


def _save(model, mn, tmp, tag):
    c = comm()
    paths = {'model': str(tmp / '{}-model-{}.npz'.format(tag, c.rank)),
             'opt': str(tmp / '{}-opt-{}.npz'.format(tag, c.rank))}
    chainer.serializers.save_npz(paths['model'], model)
    chainer.serializers.save_npz(paths['opt'], mn)
    return paths


@pytest.mark.parametrize('saved_sharded', [True, False])
def test_resume_each_rank_from_its_own_snapshot(saved_sharded, tmp_path_factory):
    """Same N: a sharded job resumed from every rank's snapshot continues bit for bit; an unsharded
    snapshot loads into a sharded optimizer, which keeps only its share."""
    c = comm()
    tmp = tmp_path_factory.mktemp('r{}'.format(c.rank))
    straight, _ = train('mlp', 'adam', True, steps=20)
    half, half_opt = train('mlp', 'adam', saved_sharded, steps=10)
    paths = _save(half, half_opt, tmp, 'half')
    got, opt = _continue('mlp', 'adam', True, paths, 10, 20)
    if saved_sharded:
        assert digest(got) == digest(straight)
    else:
        for (n, a), (_, b) in zip(sorted(straight.namedparams()), sorted(got.namedparams())):
            numpy.testing.assert_allclose(b.array, a.array, rtol=1e-6, atol=1e-7, err_msg=n)
    assert len(set(c.allgather_obj(digest(got)))) == 1
    assert opt.t == 20
    shard = opt._mn_shard
    for p, r in zip(shard.params, shard.owners):
        assert (p.update_rule.state is None) == (r != c.rank)


def test_a_share_missing_from_the_snapshot_is_refused(tmp_path_factory):
    """Every rank loading rank 0's file: the ranks that own other parameters raise KeyError."""
    c = comm()
    tmp = tmp_path_factory.mktemp('k{}'.format(c.rank))
    model, mn = train('mlp', 'adam', True, steps=2)
    path = _save(model, mn, tmp, 'two')['opt']
    path = c.bcast_obj(path)  # rank 0's file (one file system: the test's ranks share one host)
    fresh = create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), c, shard_state=True)
    fresh.setup(make('mlp'))
    owns_other = any(r != 0 for r in fresh._mn_shard.layout()[1] if c.rank == r)
    if owns_other:
        with pytest.raises(KeyError):
            chainer.serializers.load_npz(path, fresh)
    else:
        chainer.serializers.load_npz(path, fresh)


@pytest.mark.parametrize('wire', ['float16', 'bfloat16', 'auto'])
def test_wires_are_bitwise_on_every_rank_and_close(wire):
    c = comm()
    hook = {'float16': hooks.Float16, 'bfloat16': hooks.BFloat16, 'auto': hooks.Auto}[wire]()
    ref, _ = train('mlp', 'momentum', False, steps=10)
    got, opt = train('mlp', 'momentum', True, steps=10, comm_hook=hook)
    assert len(set(c.allgather_obj(digest(got)))) == 1
    for (n, a), (_, b) in zip(sorted(ref.namedparams()), sorted(got.namedparams())):
        numpy.testing.assert_allclose(b.array, a.array, rtol=2e-2, atol=2e-3, err_msg=n)


def _train_fp16(shard, steps=10):
    c = comm()
    numpy.random.seed(3)
    with chainer.using_config('dtype', numpy.float16):
        model = MLP()
    opt = chainer.optimizers.Adam(alpha=0.01)
    opt.use_fp32_update()
    mn = create_multi_node_optimizer(opt, c, shard_state=shard).setup(model)
    for it in range(steps):
        x, t = batch('mlp', it, c.rank)
        mn.update(lambda a, b: F.softmax_cross_entropy(model(a), b), x.astype(numpy.float16), t)
    return model, mn


def test_float16_parameters_with_fp32_master_copies():
    """use_fp32_update: the owner keeps the float32 copy; every rank gets the float16 parameters."""
    c = comm()
    ref, ref_opt = _train_fp16(False)
    got, opt = _train_fp16(True)
    for (n, a), (_, b) in zip(sorted(ref.namedparams()), sorted(got.namedparams())):
        assert b.array.dtype == numpy.float16
        numpy.testing.assert_allclose(b.array.astype(numpy.float32), a.array.astype(numpy.float32),
                                      rtol=1e-3, atol=1e-3, err_msg=n)
    assert len(set(c.allgather_obj(digest(got)))) == 1
    shard = opt._mn_shard
    for p, r in zip(shard.params, shard.owners):
        assert (getattr(p.update_rule, '_fp32_param', None) is None) == (r != c.rank)
    assert sum(c.allgather_obj(_sharded.state_bytes(opt))) == _sharded.state_bytes(ref_opt)
