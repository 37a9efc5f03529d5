"""Per-rank tests: the multi-node optimizer and evaluator use the model create_mnbn_model made.

Models with a Sequential inside a Chain and with one BatchNormalization shared by several places
are converted, trained one update by ``create_multi_node_optimizer`` (plain and with backward
overlap) and evaluated by ``create_multi_node_evaluator``: the optimizer updates exactly what the
forward reads, every rank ends with the same values as one process training the original model
on the global batch, and the evaluation equals that process's on the whole test set.
"""

import chainer
import chainer.computational_graph
import chainer.functions as F
import chainer.links as L
import numpy
import pytest
from chainer.training import extensions

import chainermn

comm = chainermn.create_communicator('naive')
RANK, SIZE = comm.rank, comm.size
chainer.global_config.dtype = numpy.dtype(numpy.float64)
COUNTS = [3] * SIZE                       # the optimizer wants one batch size on every rank
LOCAL = slice(3 * RANK, 3 * RANK + 3)


def _bn(size, seed):
    rng = numpy.random.RandomState(seed)
    link = L.BatchNormalization(size, initial_gamma=rng.uniform(0.5, 1.5, size),
                                initial_beta=rng.uniform(-1, 1, size))
    link.avg_mean[...] = rng.uniform(-1, 1, size)
    return link


def _linear(n_in, n_out, seed):
    rng = numpy.random.RandomState(seed)
    return L.Linear(n_in, n_out, initialW=rng.uniform(-1, 1, (n_out, n_in)),
                    initial_bias=rng.uniform(-1, 1, n_out))


class SequentialInChain(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.body = chainer.Sequential(_linear(4, 3, 1), _bn(3, 2), F.relu, _linear(3, 2, 3), _bn(2, 4))
            self.head = _linear(2, 2, 5)

    def forward(self, x):
        return self.head(self.body(x))


class SharedLink(chainer.Chain):
    def __init__(self):
        super().__init__()
        shared = _bn(3, 2)
        with self.init_scope():
            self.l1 = _linear(4, 3, 1)
            self.norm = shared
            self.seq = chainer.Sequential(_linear(3, 3, 3), shared, F.tanh, _linear(3, 2, 5))

    def forward(self, x):
        return self.seq(self.norm(self.l1(x)))


def _data(n, seed):
    rng = numpy.random.RandomState(seed)
    return rng.uniform(-1, 1, (n, 4)) * 2 + 0.3, rng.uniform(-1, 1, (n, 2))


def _params_in_graph(y):
    found = set()
    for node in chainer.computational_graph.build_computational_graph([y]).nodes:
        if isinstance(node, chainer.variable.VariableNode):
            v = node.get_variable_or_none()
            if isinstance(v, chainer.Parameter):
                found.add(id(v))
    return found


def _values(model):
    return {name: numpy.array(p.array) for name, p in model.namedparams()}


@pytest.mark.parametrize('overlap', [False, True])
@pytest.mark.parametrize('kind', [SequentialInChain, SharedLink])
def test_optimizer_and_evaluator_use_the_converted_model(kind, overlap):
    ref = kind()
    model = chainermn.links.create_mnbn_model(ref, comm)
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm, overlap=overlap)
    opt.setup(model)
    x, t = _data(3 * SIZE, seed=7)
    assert _params_in_graph(model(x[LOCAL])) == {id(p) for p in opt.target.params()}
    ref(x)   # the same forward on the global batch: the running statistics stay in step
    for link in model.links():
        assert not isinstance(link, L.BatchNormalization), link.name
    before = _values(model)

    def loss_of(m, scale):
        return lambda xb, tb: F.sum((m(xb) - tb) ** 2) * scale

    # Each rank's loss times the number of ranks: the mean of the ranks' gradients is the
    # gradient of the global batch's loss.
    opt.update(loss_of(model, SIZE), x[LOCAL], t[LOCAL])
    ref_opt = chainer.optimizers.SGD(lr=0.1).setup(ref)
    ref_opt.update(loss_of(ref, 1), x, t)
    after, want = _values(model), _values(ref)
    everyone = comm.allgather_obj(after)
    for name in after:
        if name.endswith(('/gamma', '/beta')):
            assert not numpy.allclose(after[name], before[name]), name
        for r, theirs in enumerate(everyone):
            numpy.testing.assert_array_equal(theirs[name], after[name], err_msg='{} rank {}'.format(name, r))
        numpy.testing.assert_allclose(after[name], want[name], rtol=1e-9, atol=1e-12, err_msg=name)
    for name, link in model.namedlinks():   # the running statistics of the global batch
        if isinstance(link, chainermn.links.MultiNodeBatchNormalization):
            numpy.testing.assert_allclose(link.avg_mean, dict(ref.namedlinks())[name].avg_mean, rtol=1e-10)

    # Evaluation (test mode: running statistics) of a scattered test set equals one process's.
    xs, ts = _data(5 * SIZE + 1, seed=8)
    test = chainermn.scatter_dataset(list(zip(xs, ts)), comm)
    target = chainer.links.Classifier(model, lossfun=F.mean_squared_error)
    target.compute_accuracy = False
    evaluator = chainermn.create_multi_node_evaluator(
        extensions.Evaluator(chainer.iterators.SerialIterator(test, 4, repeat=False, shuffle=False),
                             target), comm)
    result = evaluator()
    got = result['main/loss']
    with chainer.using_config('train', False):   # one process, the original model, batch by batch
        batches = [test[k:k + 4] for k in range(0, len(test), 4)]
        means = [float(F.mean_squared_error(ref(numpy.stack([x for x, _ in b])),
                                            numpy.stack([y for _, y in b])).array) for b in batches]
    # The Evaluator averages batch means; the multi-node evaluator weights ranks by examples.
    gathered = comm.allgather_obj((len(test), numpy.mean(means)))
    want = sum(n * v for n, v in gathered) / sum(n for n, _ in gathered)
    numpy.testing.assert_allclose(got, want, rtol=1e-9)
