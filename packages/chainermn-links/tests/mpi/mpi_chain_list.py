"""Per-rank tests: models split over ranks with MultiNodeChainList train exactly like one process."""

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

import chainermn_comm
from chainermn_links import MultiNodeChainList

comm = chainermn_comm.create_communicator('naive')
RANK, SIZE = comm.rank, comm.size
needs2 = pytest.mark.skipif(SIZE < 2, reason='needs at least 2 ranks')
needs3 = pytest.mark.skipif(SIZE < 3, reason='needs at least 3 ranks')
ITERS = 4
DT = numpy.float64
chainer.global_config.dtype = numpy.dtype(DT)


class MLP(chainer.Chain):
    def __init__(self, n_in, n_hidden, n_out, seed):
        super().__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_hidden, initialW=rng.normal(0, 0.5, (n_hidden, n_in)).astype(DT),
                               initial_bias=rng.normal(0, 0.1, n_hidden).astype(DT))
            self.l2 = L.Linear(n_hidden, n_out, initialW=rng.normal(0, 0.5, (n_out, n_hidden)).astype(DT),
                               initial_bias=rng.normal(0, 0.1, n_out).astype(DT))

    def forward(self, x):
        return self.l2(F.tanh(self.l1(x)))


class Fork(chainer.Chain):
    """Returns a tuple (NN0 in the reference)."""

    def __init__(self, seed):
        super().__init__()
        with self.init_scope():
            self.a = MLP(4, 5, 3, seed)
            self.b = MLP(4, 3, 2, seed + 1)

    def forward(self, x):
        return self.a(x), self.b(x)


class Join(chainer.Chain):
    """Takes a tuple (NN1 in the reference)."""

    def __init__(self, seed):
        super().__init__()
        with self.init_scope():
            self.m = MLP(5, 4, 3, seed)

    def forward(self, y):
        y0, y1 = y
        return self.m(F.concat((y0, y1), axis=1))


class Sum(chainer.Chain):
    def __init__(self, seed):
        super().__init__()
        with self.init_scope():
            self.m = MLP(6, 4, 3, seed)

    def forward(self, a, b):
        return self.m(F.concat((a, b), axis=1))


def batches(seed, n_in=4, n_out=3, batch=6):
    rng = numpy.random.RandomState(seed)
    for _ in range(ITERS):
        yield rng.normal(0, 1, (batch, n_in)).astype(DT), rng.randint(0, n_out, batch).astype(numpy.int32)


def train(step, links):
    """Run ``step(x, t)`` (forward + backward) ITERS times with SGD on ``links``."""
    opts = []
    for link in links:
        opt = chainer.optimizers.MomentumSGD(lr=0.1)
        opt.setup(link)
        opts.append(opt)
    for x, t in batches(123):
        for link in links:
            link.cleargrads()
        step(x, t)
        for opt in opts:
            opt.update()


def assert_same_params(got, want):
    g = dict(got.namedparams())
    w = dict(want.namedparams())
    assert sorted(g) == sorted(w)
    for name in w:
        numpy.testing.assert_allclose(g[name].array, w[name].array, rtol=1e-10, atol=1e-12,
                                      err_msg='rank {} param {}'.format(RANK, name))
    # Training moved the parameters away from their initial values.
    return True


@needs2
def test_split_mlp_matches_single_process():
    # Reference "split MLP on 2 processes": Model0 on rank 0, Model1 on rank 1.
    ref = chainer.ChainList(MLP(4, 5, 6, 1), MLP(6, 5, 4, 2), MLP(4, 5, 3, 3))

    def ref_step(x, t):
        F.softmax_cross_entropy(ref[2](ref[1](ref[0](x))), t).backward()
    train(ref_step, [ref])
    init = chainer.ChainList(MLP(4, 5, 6, 1), MLP(6, 5, 4, 2), MLP(4, 5, 3, 3))
    assert not numpy.allclose(init[0].l1.W.array, ref[0].l1.W.array)

    model = MultiNodeChainList(comm)
    if RANK == 0:
        first, last = MLP(4, 5, 6, 1), MLP(4, 5, 3, 3)
        model.add_link(first, rank_in=None, rank_out=1)
        model.add_link(last, rank_in=1, rank_out=None)

        def step(x, t):
            F.softmax_cross_entropy(model(x), t).backward()
    elif RANK == 1:
        middle = MLP(6, 5, 4, 2)
        model.add_link(middle, rank_in=0, rank_out=0)

        def step(x, t):
            model().backward()
    else:
        def step(x, t):
            pass
    train(step, [model])
    if RANK == 0:
        assert_same_params(first, ref[0])
        assert_same_params(last, ref[2])
    elif RANK == 1:
        assert_same_params(middle, ref[1])


@needs2
def test_tuples_between_components():
    ref = chainer.ChainList(Fork(10), Join(20), MLP(3, 4, 3, 30))

    def ref_step(x, t):
        F.softmax_cross_entropy(ref[2](ref[1](ref[0](x))), t).backward()
    train(ref_step, [ref])
    model = MultiNodeChainList(comm)
    if RANK == 0:
        fork, head = Fork(10), MLP(3, 4, 3, 30)
        model.add_link(fork, rank_in=None, rank_out=1)
        model.add_link(head, rank_in=1, rank_out=None)

        def step(x, t):
            F.softmax_cross_entropy(model(x), t).backward()
    elif RANK == 1:
        join = Join(20)
        model.add_link(join, rank_in=0, rank_out=0)

        def step(x, t):
            model().backward()
    else:
        def step(x, t):
            pass
    train(step, [model])
    if RANK == 0:
        assert_same_params(fork, ref[0])
        assert_same_params(head, ref[2])
    elif RANK == 1:
        assert_same_params(join, ref[1])


@needs2
def test_non_connected_components_with_model_output_in_the_middle():
    # Rank 0 (NonConnectedGraph2): A receives from 1 and makes the model output; then B sends
    # model inputs to 1.  Rank 1: C sends to 0; D receives from 0 and makes rank 1's output.
    # Objective: loss on rank 0 + loss on rank 1.
    ref = chainer.ChainList(MLP(3, 4, 3, 40), MLP(4, 3, 4, 41), MLP(4, 4, 3, 42), MLP(4, 5, 3, 43))

    def ref_step(x, t):
        a = ref[0](ref[2](x))
        d = ref[3](ref[1](x))
        (F.softmax_cross_entropy(a, t) + F.softmax_cross_entropy(d, t)).backward()
    train(ref_step, [ref])
    model = MultiNodeChainList(comm)
    if RANK == 0:
        a, b = MLP(3, 4, 3, 40), MLP(4, 3, 4, 41)
        model.add_link(a, rank_in=1, rank_out=None)
        model.add_link(b, rank_in=None, rank_out=1)

        def step(x, t):
            F.softmax_cross_entropy(model(x), t).backward()
    elif RANK == 1:
        c, d = MLP(4, 4, 3, 42), MLP(4, 5, 3, 43)
        model.add_link(c, rank_in=None, rank_out=0)
        model.add_link(d, rank_in=0, rank_out=None)

        def step(x, t):
            F.softmax_cross_entropy(model(x), t).backward()
    else:
        def step(x, t):
            pass
    train(step, [model])
    if RANK == 0:
        assert_same_params(a, ref[0])
        assert_same_params(b, ref[1])
    elif RANK == 1:
        assert_same_params(c, ref[2])
        assert_same_params(d, ref[3])


@needs2
def test_several_components_sending_in_a_row():
    # Rank 0 runs two components that both send to rank 1 (and never receives); rank 1 uses
    # both.  The output of model() on rank 0 is a delegate variable.
    ref = chainer.ChainList(MLP(4, 3, 3, 50), MLP(4, 3, 3, 51), Sum(52))

    def ref_step(x, t):
        F.softmax_cross_entropy(ref[2](ref[0](x), ref[1](x * 2)), t).backward()
    train(ref_step, [ref])
    model = MultiNodeChainList(comm)
    if RANK == 0:
        p, q = MLP(4, 3, 3, 50), MLP(4, 3, 3, 51)
        model.add_link(p, rank_in=None, rank_out=1)
        model.add_link(q, rank_in=None, rank_out=1)

        def step(x, t):
            # Both components get the model inputs; the second one scales them first.
            orig = q.forward

            def scaled(v):
                return orig(v * 2)
            q.forward = scaled
            try:
                out = model(x)
            finally:
                q.forward = orig
            assert out.shape == ()
            out.backward()
    elif RANK == 1:
        s = Sum(52)
        model.add_link(s, rank_in=[0, 0], rank_out=None)

        def step(x, t):
            F.softmax_cross_entropy(model(), t).backward()
    else:
        def step(x, t):
            pass
    train(step, [model])
    if RANK == 0:
        assert_same_params(p, ref[0])
        assert_same_params(q, ref[1])
    elif RANK == 1:
        assert_same_params(s, ref[2])


@needs3
def test_rank_out_list_and_rank_in_list():
    # Rank 0 sends one output to ranks 1 and 2; each transforms it and sends back; rank 0 joins.
    ref = chainer.ChainList(MLP(4, 5, 3, 60), MLP(3, 4, 3, 61), MLP(3, 4, 3, 62), Sum(63))

    def ref_step(x, t):
        h = ref[0](x)
        F.softmax_cross_entropy(ref[3](ref[1](h), ref[2](h)), t).backward()
    train(ref_step, [ref])
    model = MultiNodeChainList(comm)
    if RANK == 0:
        first, join = MLP(4, 5, 3, 60), Sum(63)
        model.add_link(first, rank_in=None, rank_out=[1, 2])
        model.add_link(join, rank_in=[1, 2], rank_out=None)

        def step(x, t):
            F.softmax_cross_entropy(model(x), t).backward()
    elif RANK in (1, 2):
        mid = MLP(3, 4, 3, 60 + RANK)
        model.add_link(mid, rank_in=0, rank_out=0)

        def step(x, t):
            model().backward()
    else:
        def step(x, t):
            pass
    train(step, [model])
    if RANK == 0:
        assert_same_params(first, ref[0])
        assert_same_params(join, ref[3])
    elif RANK in (1, 2):
        assert_same_params(mid, ref[RANK])


class Cat(chainer.Chain):
    """Concatenates its inputs (each (batch, 3)) and applies an MLP."""

    def __init__(self, n, seed):
        super().__init__()
        with self.init_scope():
            self.m = MLP(3 * n, 4, 3, seed)

    def forward(self, *xs):
        return self.m(F.concat(xs, axis=1))


def check_like_one_process(ref_forward, ref_links, model, step_inputs, mine):
    """Compare ``model`` (this rank's part) with ``ref_forward`` run on the whole model here.

    Two rounds of forward + backward with a cross-entropy loss on rank 0's model output (the
    other ranks call backward on what ``model()`` returns).  Asserts rank 0's output and input
    gradient, and the parameter gradients of this rank's components ``mine`` (name -> link)
    against the reference links of the same names.
    """
    for x, t in list(batches(321))[:2]:
        for link in list(ref_links.values()) + [model]:
            link.cleargrads()
        xr = chainer.Variable(x.copy())
        yr = ref_forward(xr)
        F.softmax_cross_entropy(yr, t).backward()
        if RANK == 0:
            xm = chainer.Variable(x.copy())
            ym = model(xm, *step_inputs)
            numpy.testing.assert_allclose(ym.array, yr.array, rtol=1e-12, atol=1e-12)
            F.softmax_cross_entropy(ym, t).backward()
            numpy.testing.assert_allclose(xm.grad, xr.grad, rtol=1e-10, atol=1e-12)
        else:
            out = model(*step_inputs)
            assert out.shape == ()
            out.backward()
        assert mine, 'rank {} owns no component'.format(RANK)
        for name, link in mine.items():
            want = dict(ref_links[name].namedparams())
            got = dict(link.namedparams())
            assert sorted(got) == sorted(want)
            for pname, p in want.items():
                assert p.grad is not None and numpy.abs(p.grad).sum() > 0, (name, pname)
                numpy.testing.assert_allclose(got[pname].grad, p.grad, rtol=1e-10, atol=1e-12,
                                              err_msg='rank {} component {} param {}'.format(
                                                  RANK, name, pname))


@pytest.mark.parametrize('self_first', [True, False])
def test_branching_through_own_rank(self_first):
    # Rank 0 keeps one branch on itself and sends the stem's output to every other rank:
    # stem: rank_out=[0] + children; keep: rank_in=0, rank_out=0; join: rank_in=[0] + children.
    children = list(range(1, SIZE))
    order = [0] + children if self_first else children + [0]
    refs = {'stem': MLP(4, 5, 3, 80), 'keep': MLP(3, 4, 3, 81), 'join': Cat(SIZE, 82)}
    refs.update({'branch{}'.format(r): MLP(3, 4, 3, 83 + r) for r in children})

    def ref_forward(x):
        h = refs['stem'](x)
        got = {0: refs['keep'](h)}
        got.update({r: refs['branch{}'.format(r)](h) for r in children})
        return refs['join'](*[got[r] for r in order])

    model = MultiNodeChainList(comm)
    if RANK == 0:
        mine = {'stem': MLP(4, 5, 3, 80), 'keep': MLP(3, 4, 3, 81), 'join': Cat(SIZE, 82)}
        model.add_link(mine['stem'], rank_in=None, rank_out=order)
        model.add_link(mine['keep'], rank_in=0, rank_out=0)
        model.add_link(mine['join'], rank_in=order, rank_out=None)
    else:
        mine = {'branch{}'.format(RANK): MLP(3, 4, 3, 83 + RANK)}
        model.add_link(mine['branch{}'.format(RANK)], rank_in=0, rank_out=0)
    check_like_one_process(ref_forward, refs, model, (), mine)


@needs2
def test_twisting_through_own_rank():
    # A chain 0 -> 1 -> ... -> last that twists back: each rank keeps a copy of what it got
    # in a local queue, and the way back joins it with what comes back from the next rank.
    #   rank 0:      a0: None -> [1, 0];      a1: [1, 0] -> None
    #   middle r:    b0: r-1 -> [r, r+1];     b1: r+1 -> r;     b2: [r, r] -> r-1
    #   last rank L: c0: L-1 -> L;            c1: L -> L-1
    last = SIZE - 1
    refs = {'a0': MLP(4, 5, 3, 90), 'a1': Cat(2, 91), 'c0': MLP(3, 4, 3, 92), 'c1': MLP(3, 3, 3, 93)}
    for r in range(1, last):
        refs.update({'b0_{}'.format(r): MLP(3, 4, 3, 100 + r), 'b1_{}'.format(r): MLP(3, 5, 3, 110 + r),
                     'b2_{}'.format(r): Cat(2, 120 + r)})

    def back(r, h):
        if r == last:
            return refs['c1'](refs['c0'](h))
        h0 = refs['b0_{}'.format(r)](h)
        g = refs['b1_{}'.format(r)](back(r + 1, h0))
        return refs['b2_{}'.format(r)](h0, g)

    def ref_forward(x):
        h0 = refs['a0'](x)
        return refs['a1'](back(1, h0), h0)

    model = MultiNodeChainList(comm)
    if RANK == 0:
        mine = {'a0': MLP(4, 5, 3, 90), 'a1': Cat(2, 91)}
        model.add_link(mine['a0'], rank_in=None, rank_out=[1, 0])
        model.add_link(mine['a1'], rank_in=[1, 0], rank_out=None)
    elif RANK == last:
        mine = {'c0': MLP(3, 4, 3, 92), 'c1': MLP(3, 3, 3, 93)}
        model.add_link(mine['c0'], rank_in=last - 1, rank_out=last)
        model.add_link(mine['c1'], rank_in=last, rank_out=last - 1)
    else:
        r = RANK
        mine = {'b0_{}'.format(r): MLP(3, 4, 3, 100 + r), 'b1_{}'.format(r): MLP(3, 5, 3, 110 + r),
                'b2_{}'.format(r): Cat(2, 120 + r)}
        model.add_link(mine['b0_{}'.format(r)], rank_in=r - 1, rank_out=[r, r + 1])
        model.add_link(mine['b1_{}'.format(r)], rank_in=r + 1, rank_out=r)
        model.add_link(mine['b2_{}'.format(r)], rank_in=[r, r], rank_out=r - 1)
    check_like_one_process(ref_forward, refs, model, (), mine)


def test_own_rank_tuple_and_training_matches_one_process():
    # A tuple sent to this rank itself arrives as a tuple; training steps match one process.
    ref = chainer.ChainList(Fork(10), Join(20), MLP(3, 4, 3, 30))

    def ref_step(x, t):
        F.softmax_cross_entropy(ref[2](ref[1](ref[0](x))), t).backward()
    train(ref_step, [ref])
    model = MultiNodeChainList(comm)
    fork, join, head = Fork(10), Join(20), MLP(3, 4, 3, 30)
    model.add_link(fork, rank_in=None, rank_out=RANK)
    model.add_link(join, rank_in=RANK, rank_out=[RANK])
    model.add_link(head, rank_in=[RANK], rank_out=None)
    train(lambda x, t: F.softmax_cross_entropy(model(x), t).backward(), [model])
    assert_same_params(fork, ref[0])
    assert_same_params(join, ref[1])
    assert_same_params(head, ref[2])


def test_own_rank_errors():
    model = MultiNodeChainList(comm)
    with pytest.raises(ValueError, match='receives 1 input.*from this process itself.*only 0'):
        model.add_link(MLP(2, 2, 2, 0), rank_in=RANK)
    model.add_link(MLP(2, 2, 2, 0), rank_out=[RANK])
    with pytest.raises(ValueError, match='receives 2 input.*only 1'):
        model.add_link(MLP(2, 2, 2, 0), rank_in=[RANK, RANK])
    assert len(model) == 1
    # An output sent to this rank that nobody receives is refused before any communication.
    with pytest.raises(ValueError, match='that no later component receives'):
        model(numpy.zeros((1, 2)))
    model.add_link(MLP(2, 2, 2, 1), rank_in=RANK)
    assert model(numpy.zeros((1, 2))).shape == (1, 2)


def test_add_link_argument_errors():
    model = MultiNodeChainList(comm)
    with pytest.raises(ValueError, match='itself'):
        model.add_link(MLP(2, 2, 2, 0), rank_in=RANK)
    with pytest.raises(ValueError, match='rank_out'):
        model.add_link(MLP(2, 2, 2, 0), rank_out=SIZE)
    model.add_link(MLP(2, 2, 2, 0))
    assert len(list(model.params())) == 4


def test_single_rank_model_is_plain_chain():
    ref = MLP(4, 5, 3, 70)

    def ref_step(x, t):
        F.softmax_cross_entropy(ref(x), t).backward()
    train(ref_step, [ref])
    model = MultiNodeChainList(comm)
    m = MLP(4, 5, 3, 70)
    model.add_link(m)
    train(lambda x, t: F.softmax_cross_entropy(model(x), t).backward(), [model])
    assert_same_params(m, ref)
