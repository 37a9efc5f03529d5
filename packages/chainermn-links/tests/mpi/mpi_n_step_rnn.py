"""Per-rank tests: RNN layers stacked over ranks with create_multi_node_n_step_rnn equal one process."""

import copy

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

import chainermn_comm
from chainermn_links import functions as mnf
from chainermn_links.links import create_multi_node_n_step_rnn

comm = chainermn_comm.create_communicator('naive')
RANK, SIZE = comm.rank, comm.size
needs2 = pytest.mark.skipif(SIZE < 2, reason='needs at least 2 ranks')
DT = numpy.float64
BATCH = 3

# One layer per rank; every layer's hidden state has shape (2, BATCH, 4).
STACKS = {
    'lstm': [lambda: L.NStepLSTM(2, 3, 4, 0.0)] * 3,
    'gru': [lambda: L.NStepGRU(2, 3, 4, 0.0)] * 3,
    # heterogeneous: other kinds, directions and input sizes with the same states
    'mixed_lstm': [lambda: L.NStepLSTM(2, 3, 4, 0.0), lambda: L.NStepBiLSTM(1, 5, 4, 0.0),
                   lambda: L.NStepLSTM(2, 2, 4, 0.0)],
    'mixed_one_state': [lambda: L.NStepGRU(2, 3, 4, 0.0), lambda: L.NStepBiRNNReLU(1, 5, 4, 0.0),
                        lambda: L.NStepRNNTanh(2, 2, 4, 0.0)],
}


def make_layers(kind, seed):
    numpy.random.seed(seed)
    with chainer.using_config('dtype', DT):
        return [make() for make in STACKS[kind][:SIZE]]


def sequences(layer, r, it):
    rng = numpy.random.RandomState(1000 * it + r)
    in_size = layer[0].w0.shape[1]
    return [rng.uniform(-1, 1, (n, in_size)).astype(DT) for n in (4, 2, 3)]


def weights(shape, r, it, k):
    return numpy.random.RandomState(50000 + 1000 * it + 10 * r + k).uniform(-1, 1, shape).astype(DT)


def layer_loss(outputs, r, it):
    """Loss of layer r: its sequence outputs and final states weighted by fixed random arrays."""
    *states, ys = outputs
    loss = 0
    for k, y in enumerate(ys):
        loss = loss + F.sum(y * weights(y.shape, r, it, k))
    for k, h in enumerate(states):
        loss = loss + F.sum(h * weights(h.shape, r, it, 10 + k))
    return loss


def reference(layers, it):
    """Run the whole stack here; return per layer (outputs, input variables)."""
    results = []
    states = (None,) * layers[0].n_cells
    total = 0
    for r, layer in enumerate(layers):
        xs = [chainer.Variable(x) for x in sequences(layer, r, it)]
        outputs = layer(*(states + (xs,)))
        states = tuple(outputs[:-1])
        total = total + layer_loss(outputs, r, it)
        results.append((outputs, xs))
    total.backward()
    return results


@pytest.mark.parametrize('kind', sorted(STACKS))
def test_stack_over_ranks_matches_one_process(kind):
    ref_layers = make_layers(kind, seed=7)
    mine = copy.deepcopy(ref_layers[RANK])
    rnn = create_multi_node_n_step_rnn(mine, comm, rank_in=RANK - 1 if RANK > 0 else None,
                                       rank_out=RANK + 1 if RANK < SIZE - 1 else None)
    assert rnn.actual_rnn is mine
    for it in range(2):
        for layer in ref_layers:
            layer.cleargrads()
        rnn.cleargrads()
        want_outputs, want_xs = reference(ref_layers, it)[RANK]
        xs = [chainer.Variable(x) for x in sequences(mine, RANK, it)]
        outputs = rnn(xs)
        assert len(outputs) == mine.n_cells + 2
        *got, delegate = outputs
        assert (delegate is None) == (RANK == SIZE - 1)
        for g, w in zip(got[:-1], want_outputs[:-1]):
            numpy.testing.assert_allclose(g.array, w.array, rtol=1e-12, atol=1e-12)
        for g, w in zip(got[-1], want_outputs[-1]):
            numpy.testing.assert_allclose(g.array, w.array, rtol=1e-12, atol=1e-12)
        loss = layer_loss(got, RANK, it)
        if delegate is not None:
            loss = mnf.pseudo_connect(delegate, loss)
        loss.backward()
        for g, w in zip(xs, want_xs):
            numpy.testing.assert_allclose(g.grad, w.grad, rtol=1e-10, atol=1e-12)
        want = dict(ref_layers[RANK].namedparams())
        got_params = dict(mine.namedparams())
        assert sorted(got_params) == sorted(want)
        for name, p in want.items():
            assert numpy.abs(p.grad).sum() > 0, name
            numpy.testing.assert_allclose(got_params[name].grad, p.grad, rtol=1e-10, atol=1e-12,
                                          err_msg='rank {} {} param {}'.format(RANK, kind, name))


@needs2
def test_training_steps_match_one_process():
    ref_layers = make_layers('lstm', seed=11)
    ref_opts = []
    for layer in ref_layers:
        opt = chainer.optimizers.SGD(lr=0.1)
        opt.setup(layer)
        ref_opts.append(opt)
    rnn = create_multi_node_n_step_rnn(copy.deepcopy(ref_layers[RANK]), comm,
                                       rank_in=RANK - 1 if RANK > 0 else None,
                                       rank_out=RANK + 1 if RANK < SIZE - 1 else None)
    opt = chainer.optimizers.SGD(lr=0.1)
    opt.setup(rnn)
    for it in range(3):
        for layer in ref_layers:
            layer.cleargrads()
        reference(ref_layers, it)
        for o in ref_opts:
            o.update()
        rnn.cleargrads()
        *got, delegate = rnn([chainer.Variable(x) for x in sequences(rnn.actual_rnn, RANK, it)])
        loss = layer_loss(got, RANK, it)
        (loss if delegate is None else mnf.pseudo_connect(delegate, loss)).backward()
        opt.update()
    for (name, p), (_, q) in zip(sorted(rnn.actual_rnn.namedparams()), sorted(ref_layers[RANK].namedparams())):
        numpy.testing.assert_allclose(p.array, q.array, rtol=1e-10, atol=1e-12, err_msg=name)


@needs2
def test_state_count_mismatch_is_reported():
    # An LSTM sends (hy, cy); a GRU on the next rank expects only hy.
    if RANK == 0:
        rnn = create_multi_node_n_step_rnn(L.NStepLSTM(1, 3, 4, 0.0), comm, rank_out=1)
        *_, delegate = rnn([numpy.ones((2, 3), numpy.float32)])
        assert delegate.shape == ()
    elif RANK == 1:
        rnn = create_multi_node_n_step_rnn(L.NStepGRU(1, 3, 4, 0.0), comm, rank_in=0)
        with pytest.raises(ValueError, match='expects 1 state array.*from rank 0 but received 2'):
            rnn([numpy.ones((2, 3), numpy.float32)])


def test_argument_errors():
    with pytest.raises(TypeError, match='needs an NStep RNN link'):
        create_multi_node_n_step_rnn(L.Linear(3, 4), comm)
    with pytest.raises(ValueError, match='names this process itself'):
        create_multi_node_n_step_rnn(L.NStepGRU(1, 3, 4, 0.0), comm, rank_in=RANK)
    with pytest.raises(ValueError, match='rank_out must be None or an int'):
        create_multi_node_n_step_rnn(L.NStepGRU(1, 3, 4, 0.0), comm, rank_out=SIZE)


def test_no_ranks_is_the_plain_link():
    layer = make_layers('gru', seed=3)[0]
    rnn = create_multi_node_n_step_rnn(copy.deepcopy(layer), comm)
    xs = sequences(layer, 0, 0)
    hy, ys, delegate = rnn(xs)
    want_hy, want_ys = layer(None, xs)
    assert delegate is None
    numpy.testing.assert_array_equal(hy.array, want_hy.array)
    c = copy.deepcopy(rnn)
    assert c.communicator is comm and c.actual_rnn is not rnn.actual_rnn


# -- Chainer v7's own usage: EmbedID, the multi-node RNN, two Linears; `err, = pseudo_connect(...)` --
V7_STACKS = {
    # (make the RNN of rank r, hidden units of the Linear after it on rank r)
    'lstm': (lambda r: L.NStepLSTM(1, 5, 5, 0.0), lambda r: 2),
    'gru': (lambda r: L.NStepGRU(1, 5, 5, 0.0), lambda r: 2),
    'rnn_tanh': (lambda r: L.NStepRNNTanh(1, 5, 5, 0.0), lambda r: 2),
    # heterogeneous: a different model on each rank (v7's test varies the Linear; here the RNN too)
    'hetero_lstm': (lambda r: L.NStepLSTM(1, 5, 5, 0.0), lambda r: (r + 1) * 10),
    'hetero_mixed': (lambda r: [L.NStepGRU(1, 5, 5, 0.0), L.NStepRNNTanh(1, 5, 5, 0.0),
                                L.NStepRNNReLU(1, 5, 5, 0.0)][r], lambda r: (r + 1) * 10),
}


class V7Parts(chainer.Chain):
    """One rank's model of v7's test; ``rnn`` is the plain link here (the reference runs every rank's)."""

    def __init__(self, kind, r):
        super().__init__()
        make_rnn, n_hid = V7_STACKS[kind]
        numpy.random.seed(300 + r)
        with chainer.using_config('dtype', DT), self.init_scope():
            self.l1 = L.EmbedID(8, 5, ignore_label=-1)
            self.rnn = make_rnn(r)
            self.l2 = L.Linear(5, n_hid(r))
            self.l3 = L.Linear(n_hid(r), 1)

    def loss(self, ys, t):
        h = self.l3(self.l2(F.concat(ys, axis=0)))
        return F.mean_squared_error(F.sum(h, axis=0), t)


def v7_batch(r, it):
    rng = numpy.random.RandomState(7000 + 100 * it + r)
    xs = [rng.randint(0, 8, size=n).astype(numpy.int32) for n in (5, 3)]
    return xs, rng.uniform(0, 2, (1,)).astype(DT)


@pytest.mark.parametrize('kind', sorted(V7_STACKS))
def test_v7_usage_matches_one_process(kind):
    ref = [V7Parts(kind, r) for r in range(SIZE)]
    mine = copy.deepcopy(ref[RANK])
    rnn = create_multi_node_n_step_rnn(mine.rnn, comm, RANK - 1 if RANK > 0 else None,
                                       RANK + 1 if RANK < SIZE - 1 else None)
    for it in range(2):
        for p in ref:
            p.cleargrads()
        mine.cleargrads()
        # Reference: every rank's model in one process, states passed from layer to layer.
        states, total, losses = (None,) * ref[0].rnn.n_cells, 0, []
        for r, part in enumerate(ref):
            xs, t = v7_batch(r, it)
            outputs = part.rnn(*(states + ([part.l1(x) for x in xs],)))
            states = tuple(outputs[:-1])
            losses.append(part.loss(outputs[-1], t))
            total = total + losses[-1]
        total.backward()
        # This rank's part, written the way v7's test writes it.
        xs, t = v7_batch(RANK, it)
        h1 = [mine.l1(x) for x in xs]
        if mine.rnn.n_cells == 2:
            hy, cy, ys, delegate = rnn(h1)
            assert cy.shape == hy.shape == (1, 2, 5)
        else:
            hy, ys, delegate = rnn(h1)
            assert hy.shape == (1, 2, 5)
        err, = mnf.pseudo_connect(delegate, mine.loss(ys, t))
        err.backward()
        numpy.testing.assert_allclose(err.array, losses[RANK].array, rtol=1e-12)
        want = dict(ref[RANK].namedparams())
        got = dict(mine.namedparams())
        assert sorted(got) == sorted(want)
        for name, p in want.items():
            assert numpy.abs(p.grad).sum() > 0, name
            numpy.testing.assert_allclose(got[name].grad, p.grad, rtol=1e-10, atol=1e-12,
                                          err_msg='rank {} {} param {}'.format(RANK, kind, name))
