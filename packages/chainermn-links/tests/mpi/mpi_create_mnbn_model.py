"""Per-rank tests: create_mnbn_model converts every BatchNormalization the forward pass runs.

For each container (Chain, ChainList, Sequential, a Sequential in a Chain, a link shared by
several places): the forward runs with chainer's BatchNormalization made to fail, the parameters
the forward uses are exactly the model's (what an optimizer sees), the outputs and running
statistics equal one process running the original on the global batch, and one averaged update
changes gamma and beta alike on every rank, as one process would.
"""

import copy
import warnings

import chainer
import chainer.computational_graph
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

import chainermn_comm
from chainermn_links.links import MultiNodeBatchNormalization, create_mnbn_model
from chainermn_links.links.create_mnbn_model import ModelConversionWarning
from v7_mnbn_models import v7_model

comm = chainermn_comm.create_communicator('naive')
chainer.global_config.dtype = numpy.dtype(numpy.float64)   # exact comparisons with one process
RANK, SIZE = comm.rank, comm.size
COUNTS = [r + 2 for r in range(SIZE)]        # local batch sizes differ per rank
START = sum(COUNTS[:RANK])
LOCAL = slice(START, START + COUNTS[RANK])


def global_batch(width, seed):
    rng = numpy.random.RandomState(seed)
    return (rng.uniform(-1, 1, (sum(COUNTS), width)) * 2 + 0.3).astype(numpy.float64)


def bn(size, seed):
    """A BatchNormalization whose gamma, beta and running statistics are not the defaults."""
    rng = numpy.random.RandomState(seed)
    link = L.BatchNormalization(size, initial_gamma=rng.uniform(0.5, 1.5, size),
                                initial_beta=rng.uniform(-1, 1, size))
    link.avg_mean[...] = rng.uniform(-1, 1, size)
    link.N = 3
    return link


def linear(n_in, n_out, seed):
    rng = numpy.random.RandomState(seed)
    return L.Linear(n_in, n_out, initialW=rng.uniform(-1, 1, (n_out, n_in)),
                    initial_bias=rng.uniform(-1, 1, n_out))


class BnChain(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = linear(4, 3, 1)
            self.bn1 = bn(3, 2)
            self.l2 = linear(3, 2, 3)
            self.bn2 = bn(2, 4)

    def forward(self, x):
        return self.bn2(self.l2(F.relu(self.bn1(self.l1(x)))))


class BnChainList(chainer.ChainList):
    def __init__(self):
        super().__init__(linear(4, 3, 1), bn(3, 2), chainer.ChainList(linear(3, 2, 3), bn(2, 4)))

    def forward(self, x):
        h = F.relu(self[1](self[0](x)))
        return self[2][1](self[2][0](h))


def bn_sequential():
    return chainer.Sequential(linear(4, 3, 1), bn(3, 2), F.relu, linear(3, 2, 3), bn(2, 4))


class SequentialInChain(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            # a lambda layer: Sequential refuses to pickle it, the conversion copies it anyway
            self.body = chainer.Sequential(linear(4, 3, 1), bn(3, 2), lambda h: F.relu(h),
                                           chainer.Sequential(linear(3, 2, 3), bn(2, 4)))
            self.head = linear(2, 2, 5)

    def forward(self, x):
        return self.head(self.body(x))


class SharedLink(chainer.Chain):
    """One BatchNormalization registered twice and run three times, also from a Sequential and a list."""

    def __init__(self):
        super().__init__()
        shared = bn(3, 2)
        with self.init_scope():
            self.l1 = linear(4, 3, 1)
            self.norm = shared
            self.again = shared
            self.seq = chainer.Sequential(linear(3, 3, 3), shared, F.relu)
        self.stages = [self.seq, (self.norm, F.tanh)]   # plain containers of registered links

    def forward(self, x):
        h = self.seq(self.again(self.l1(x)))
        link, act = self.stages[1]
        return act(link(h))


MODELS = {'chain': BnChain, 'chain_list': BnChainList, 'sequential': bn_sequential,
          'sequential_in_chain': SequentialInChain, 'shared_link': SharedLink}
N_BN = {'chain': 2, 'chain_list': 2, 'sequential': 2, 'sequential_in_chain': 2, 'shared_link': 1}
N_CALLS = {'chain': 2, 'chain_list': 2, 'sequential': 2, 'sequential_in_chain': 2, 'shared_link': 3}


@pytest.fixture
def plain_bn_fails(monkeypatch):
    """Make chainer's BatchNormalization fail when called; count the calls of the multi-node one."""
    def fail(self, *args, **kwargs):
        raise AssertionError('the forward pass called an unconverted BatchNormalization ({})'.format(self.name))
    calls = []
    original = MultiNodeBatchNormalization.forward

    def counted(self, *args, **kwargs):
        calls.append(id(self))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(L.BatchNormalization, 'forward', fail)
    monkeypatch.setattr(MultiNodeBatchNormalization, 'forward', counted)
    return calls


def params_in_graph(y):
    """Return the ids of the Parameters the graph of ``y`` reads."""
    graph = chainer.computational_graph.build_computational_graph([y])
    found = set()
    for node in graph.nodes:
        if isinstance(node, chainer.variable.VariableNode):
            v = node.get_variable_or_none()
            if isinstance(v, chainer.Parameter):
                found.add(id(v))
    return found


def snapshot(model):
    return {name: numpy.array(p.array) for name, p in model.namedparams()}


@pytest.mark.parametrize('kind', sorted(MODELS))
def test_forward_runs_only_converted_links_and_trains_like_one_process(kind, plain_bn_fails):
    ref = MODELS[kind]()
    before = snapshot(ref)
    model = create_mnbn_model(ref, comm)
    # Every BatchNormalization is converted, once, and the original is untouched.
    mn_links = {id(l) for l in model.links() if isinstance(l, MultiNodeBatchNormalization)}
    assert len(mn_links) == N_BN[kind]
    assert not any(isinstance(l, L.BatchNormalization) for l in model.links())
    assert sum(isinstance(l, L.BatchNormalization) for l in {id(l): l for l in ref.links()}.values()) \
        == N_BN[kind]
    assert sorted(n for n, _ in model.namedparams()) == sorted(before)

    xg = global_batch(4, seed=10)
    y = model(xg[LOCAL])
    assert set(plain_bn_fails) == mn_links and len(plain_bn_fails) == N_CALLS[kind]
    # What the forward reads is what an optimizer of the model updates, and nothing else.
    assert params_in_graph(y) == {id(p) for p in model.params()}



@pytest.mark.parametrize('kind', sorted(MODELS))
def test_statistics_and_update_equal_one_process(kind):
    ref = MODELS[kind]()
    model = create_mnbn_model(ref, comm)
    xg = global_batch(4, seed=20)
    wg = global_batch(2 if kind != 'shared_link' else 3, seed=21)
    # Each rank's loss is scaled by the number of ranks, so the mean of the ranks' gradients
    # (what the multi-node optimizer applies) is the gradient of the global batch's loss.
    ym = model(xg[LOCAL])
    loss = F.sum(ym * wg[LOCAL]) * SIZE
    yr = ref(xg)
    loss_ref = F.sum(yr * wg)
    numpy.testing.assert_allclose(ym.array, yr.array[LOCAL], rtol=1e-10, atol=1e-10)
    mn = {name: l for name, l in model.namedlinks() if isinstance(l, MultiNodeBatchNormalization)}
    plain = dict(ref.namedlinks())
    for name, link in mn.items():
        numpy.testing.assert_allclose(link.avg_mean, plain[name].avg_mean, rtol=1e-10, err_msg=name)
        numpy.testing.assert_allclose(link.avg_var, plain[name].avg_var, rtol=1e-10, err_msg=name)

    opt = chainer.optimizers.SGD(lr=0.1).setup(model)
    opt_ref = chainer.optimizers.SGD(lr=0.1).setup(ref)
    before = snapshot(model)
    model.cleargrads()
    loss.backward()
    comm.multi_node_mean_grad(model)
    opt.update()
    ref.cleargrads()
    loss_ref.backward()
    opt_ref.update()
    after, after_ref = snapshot(model), snapshot(ref)
    everyone = comm.allgather_obj(after)
    for name in after:
        if name.endswith(('/gamma', '/beta')):
            assert not numpy.allclose(after[name], before[name]), name   # the update reached it
        for r, theirs in enumerate(everyone):
            numpy.testing.assert_array_equal(theirs[name], after[name], err_msg='{} rank {}'.format(name, r))
        numpy.testing.assert_allclose(after[name], after_ref[name], rtol=1e-9, atol=1e-12, err_msg=name)


# -- Chainer v7's own cases (tests/chainermn_tests/links_tests/test_create_mnbn_model.py), on the CPU --
def devices():
    out = ['@numpy']
    try:
        import chainerx
        if chainerx.is_available():
            out.append('native:0')
    except ImportError:
        pass
    return out


@pytest.mark.parametrize('device', devices())
@pytest.mark.parametrize('kind', ['sequential', 'chain', 'chain_list'])
def test_v7_cases_on_the_cpu(kind, device, plain_bn_fails):
    mn = create_mnbn_model(v7_model(kind), comm)
    mn.to_device(device)
    with chainer.using_device(mn.device):
        y = mn(mn.xp.zeros((1, 1, 1, 1), dtype=numpy.float64))
    assert y.shape == (1, 3, 3, 3) and len(plain_bn_fails) == 1
    assert all(p.device == mn.device for p in mn.params())


# -- what the copy cannot see ------------------------------------------------------------------
class ClosureOverSelf(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.bn = L.BatchNormalization(3)
        self.act = lambda h: F.relu(self.bn(h))   # the copy's act would call the original's bn

    def forward(self, x):
        return self.act(x)


def test_a_closure_over_the_original_model_is_an_error():
    with pytest.raises(ValueError, match=r"rank {}: create_mnbn_model copies the model, but .*"
                       r"model\.act \(closure variable 'self'\) holds the original model itself "
                       r"\(ClosureOverSelf\)".format(RANK)):
        create_mnbn_model(ClosureOverSelf(), comm)
    outer = chainer.Sequential(L.Linear(3, 3), L.BatchNormalization(3))
    layer = chainer.Sequential(lambda h: outer[1](h))   # captures a link of the model being copied
    model = chainer.Sequential(outer, layer)
    with pytest.raises(ValueError, match=r"model\[1\]\[0\] \(closure variable 'outer'\) "
                       r"holds the original model's link '/0' \(Sequential\)"):
        create_mnbn_model(model, comm)


def test_unregistered_batch_normalizations_are_named_in_a_warning():
    class Hidden(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(3, 3)
            self.loose = L.BatchNormalization(3)          # not registered: no optimizer sees it

    def build():
        stranger = L.BatchNormalization(3)
        return chainer.Sequential(Hidden(), lambda h: stranger(h))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model = create_mnbn_model(build(), comm)
    texts = [str(w.message) for w in caught if issubclass(w.category, ModelConversionWarning)]
    assert len(texts) == 1, texts
    assert texts[0].startswith('rank {}: create_mnbn_model left 2 BatchNormalization(s) unconverted'.format(RANK))
    assert "model[0].loose" in texts[0]
    assert "model[1] (closure variable 'stranger')" in texts[0]
    assert type(model[0].loose) is L.BatchNormalization
    with warnings.catch_warnings():
        warnings.simplefilter('error')                    # nothing to say about a clean model
        create_mnbn_model(bn_sequential(), comm)


def test_what_the_copy_shares_and_what_it_refuses():
    class HoldsComm(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.bn = L.BatchNormalization(3)
            self.comm = comm
            self.sub = chainer.Sequential(L.Linear(3, 3))
            self.sub.comm = comm

    model = create_mnbn_model(HoldsComm(), comm)
    assert model.comm is comm and model.sub.comm is comm and model.bn.comm is comm
    single = bn(3, 7)
    mn = create_mnbn_model(single, comm)
    assert isinstance(mn, MultiNodeBatchNormalization) and type(single) is L.BatchNormalization
    numpy.testing.assert_array_equal(mn.gamma.array, single.gamma.array)
    numpy.testing.assert_array_equal(mn.avg_mean, single.avg_mean)
    assert mn.N == single.N == 3
    with pytest.raises(ValueError, match=r"cannot convert link '/1': the BatchNormalization has no size yet"):
        create_mnbn_model(chainer.Sequential(L.Linear(3, 3), _lazy_bn()), comm)
    with pytest.raises(TypeError, match='create_mnbn_model needs a chainer.Link'):
        create_mnbn_model([L.BatchNormalization(3)], comm)
    seq = bn_sequential()
    layers, children = [id(l) for l in seq], [id(l) for l in seq.children()]
    create_mnbn_model(seq, comm)                          # the original keeps its own links
    assert [id(l) for l in seq] == layers and [id(l) for l in seq.children()] == children
    assert sum(type(l) is L.BatchNormalization for l in seq) == 2


def _lazy_bn():
    link = L.BatchNormalization(3)
    link.avg_mean = None      # as a BatchNormalization(size=None) is before its first call
    return link


# -- the other helpers that wrap a model ------------------------------------------------------
def test_multi_node_chain_list_and_n_step_rnn_keep_their_links(plain_bn_fails):
    from chainermn_links import MultiNodeChainList
    from chainermn_links.links import create_multi_node_n_step_rnn

    class Stack(MultiNodeChainList):
        def __init__(self):
            super().__init__(comm)
            self.add_link(bn_sequential(), rank_in=None, rank_out=None)   # every rank: its own part

    ref = Stack()
    model = create_mnbn_model(ref, comm)
    assert model.comm is comm and model._rank_inouts == [(None, None)]
    xg = global_batch(4, seed=30)
    y = model(xg[LOCAL])
    assert len(plain_bn_fails) == 2 and params_in_graph(y) == {id(p) for p in model.params()}
    alone = create_mnbn_model(bn_sequential(), comm)(xg[LOCAL])    # the same part without the list
    numpy.testing.assert_allclose(y.array, alone.array, rtol=1e-12, atol=1e-12)
    assert len(plain_bn_fails) == 4

    class WithRnn(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.rnn = create_multi_node_n_step_rnn(L.NStepGRU(1, 3, 3, 0.0), comm)
                self.bn = L.BatchNormalization(3)

        def forward(self, xs):
            hy, ys, _ = self.rnn(xs)
            return self.bn(hy[0])

    rnn_model = create_mnbn_model(WithRnn(), comm)
    assert rnn_model.rnn.communicator is comm and rnn_model.rnn.actual_rnn in set(rnn_model.links())
    y = rnn_model([xg[LOCAL][:, :3] for _ in range(2)])
    assert len(plain_bn_fails) == 5 and params_in_graph(y) == {id(p) for p in rnn_model.params()}
