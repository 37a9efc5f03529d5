"""Per-rank tests on a GPU or comm's NumPy stand-in for CuPy: ``to_device`` moves the whole converted model.

Run by test_create_mnbn_model_fakecupy.py (``packages/chainermn-comm/tests/fakecupy`` first on
PYTHONPATH) and by test_create_mnbn_model_gpu.py (CuPy and a GPU).  Each rank uses its own device
(``intra_rank``); the converted model runs forward (chainer's BatchNormalization made to fail) and
backward on the device, and its outputs, gradients and running statistics equal the same
converted model on the CPU.  On a GPU, Chainer v7's own cases (a convolution) run as well.
"""

import fakecupy_chainer

cupy = fakecupy_chainer.install()
FAKE = getattr(cupy, 'IS_FAKE', False)

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import numpy  # noqa: E402
import pytest  # noqa: E402

import chainermn_comm  # noqa: E402
from chainermn_links.links import MultiNodeBatchNormalization, create_mnbn_model  # noqa: E402
from v7_mnbn_models import v7_model  # noqa: E402

chainer.global_config.use_cudnn = 'never'
COMMS = {name: chainermn_comm.create_communicator(name) for name in ('naive', 'pure_nccl')}
comm = COMMS['naive']
RANK, SIZE, DEVICE = comm.rank, comm.size, comm.intra_rank
COUNTS = [r + 2 for r in range(SIZE)]
START = sum(COUNTS[:RANK])
LOCAL = slice(START, START + COUNTS[RANK])


def bn(size, seed):
    rng = numpy.random.RandomState(seed)
    link = L.BatchNormalization(size, initial_gamma=rng.uniform(0.5, 1.5, size).astype(numpy.float32),
                                initial_beta=rng.uniform(-1, 1, size).astype(numpy.float32))
    link.avg_mean[...] = rng.uniform(-1, 1, size)
    return link


def linear(n_in, n_out, seed):
    rng = numpy.random.RandomState(seed)
    return L.Linear(n_in, n_out, initialW=rng.uniform(-1, 1, (n_out, n_in)).astype(numpy.float32))


# No activations: chainer's own activations run CUDA kernel sources that the stand-in cannot.
def sequential():
    return chainer.Sequential(linear(4, 3, 1), bn(3, 2), linear(3, 2, 3), bn(2, 4))


class SequentialInChain(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.body = chainer.Sequential(linear(4, 3, 1), bn(3, 2), chainer.Sequential(linear(3, 2, 3), bn(2, 4)))
            self.head = linear(2, 2, 5)

    def forward(self, x):
        return self.head(self.body(x))


class SharedLink(chainer.Chain):
    def __init__(self):
        super().__init__()
        shared = bn(3, 2)
        with self.init_scope():
            self.l1 = linear(4, 3, 1)
            self.norm = shared
            self.seq = chainer.Sequential(linear(3, 3, 3), shared, linear(3, 2, 5))

    def forward(self, x):
        return self.seq(self.norm(self.l1(x)))


class BnChainList(chainer.ChainList):
    def __init__(self):
        super().__init__(linear(4, 3, 1), bn(3, 2), chainer.ChainList(linear(3, 2, 3), bn(2, 4)))

    def forward(self, x):
        return self[2][1](self[2][0](self[1](self[0](x))))


MODELS = {'sequential': sequential, 'sequential_in_chain': SequentialInChain, 'shared_link': SharedLink,
          'chain_list': BnChainList}


def arrays_of(model):
    """Yield (where, array) for every parameter, gradient and persistent the forward can reach."""
    seen = set()
    stack = [('model', model)]
    while stack:
        where, link = stack.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        for name, p in link.namedparams():
            yield where + name, p.array
            if p.array is not None and p.grad is not None:
                yield where + name + '.grad', p.grad
        for lname, sub in link.namedlinks():
            for attr in sub._persistent:
                value = getattr(sub, attr)
                if hasattr(value, 'shape'):
                    yield where + lname + '.' + attr, value
        # What a Sequential's forward runs besides its children.
        for lname, sub in link.namedlinks():
            for i, layer in enumerate(getattr(sub, '_layers', ())):
                if isinstance(layer, chainer.Link):
                    stack.append(('{}{}[{}]'.format(where, lname, i), layer))


def fail(self, *args, **kwargs):
    raise AssertionError('the forward pass called an unconverted BatchNormalization ({})'.format(self.name))


def run(model, x, w, comm_):
    y = model(x)
    F.sum(y * w).backward()
    comm_.multi_node_mean_grad(model)
    return y


@pytest.mark.parametrize('move', ['to_device', 'to_gpu'])
@pytest.mark.parametrize('comm_name', sorted(COMMS))
@pytest.mark.parametrize('kind', sorted(MODELS))
def test_to_device_moves_the_whole_converted_model(kind, comm_name, move, monkeypatch):
    c = COMMS[comm_name]
    ref = MODELS[kind]()
    on_host = create_mnbn_model(ref, c, communication_backend='mpi')
    model = create_mnbn_model(ref, c)
    if move == 'to_device':
        model.to_device('@cupy:{}'.format(DEVICE))
    else:
        model.to_gpu(DEVICE)
    assert str(model.device) == '@cupy:{}'.format(DEVICE)
    for where, a in arrays_of(model):
        assert isinstance(a, cupy.ndarray) and a.device.id == DEVICE, (where, type(a))

    rng = numpy.random.RandomState(5)
    xg = rng.uniform(-1, 1, (sum(COUNTS), 4)).astype(numpy.float32)
    wg = rng.uniform(-1, 1, (sum(COUNTS), 2)).astype(numpy.float32)
    monkeypatch.setattr(L.BatchNormalization, 'forward', fail)
    with chainer.using_device(model.device):
        y = run(model, cupy.asarray(xg[LOCAL]), cupy.asarray(wg[LOCAL]), c)
    assert isinstance(y.array, cupy.ndarray)
    y_host = run(on_host, xg[LOCAL], wg[LOCAL], c)
    numpy.testing.assert_allclose(y.array.get(), y_host.array, rtol=1e-5, atol=1e-6)
    host = dict(arrays_of(on_host))
    for where, a in arrays_of(model):   # gradients (averaged over ranks) and running statistics
        assert isinstance(a, cupy.ndarray), where
        numpy.testing.assert_allclose(a.get(), host[where], rtol=1e-5, atol=1e-6, err_msg=where)
    mn = [link for link in model.links() if isinstance(link, MultiNodeBatchNormalization)]
    assert mn and all(link.communication_backend == ('nccl' if comm_name == 'pure_nccl' else 'mpi')
                      for link in mn)


def v7_device(chx):
    if not chx:
        return chainer.get_device('@cupy:{}'.format(DEVICE))
    import chainerx
    if not chainerx.is_available():
        pytest.skip('ChainerX is not built into this Chainer')
    try:
        return chainer.get_device('cuda:{}'.format(DEVICE))
    except Exception as e:   # ChainerX built without CUDA
        pytest.skip('ChainerX has no CUDA backend here: {}'.format(e))


@pytest.mark.parametrize('chx', [False, True], ids=['cupy', 'chainerx'])
@pytest.mark.parametrize('kind', ['sequential', 'chain', 'chain_list'])
def test_v7_create_mnbn_model_gpu(kind, chx, monkeypatch):
    """Chainer v7's test_create_mnbn_model_{sequential,chain,chain_list}_gpu, plus the moved arrays."""
    model = v7_model(kind)
    mn = create_mnbn_model(model, comm)
    device = v7_device(chx)
    device.use()
    mn.to_device(device)
    bn = mn[1] if kind != 'chain' else mn.bn
    assert isinstance(bn, MultiNodeBatchNormalization) and bn in set(mn.links())
    if FAKE:   # a convolution runs CUDA kernels: only the move is checked on the stand-in
        for where, a in arrays_of(mn):
            assert a is None or isinstance(a, cupy.ndarray), where
        return
    monkeypatch.setattr(L.BatchNormalization, 'forward', fail)
    with chainer.using_device(mn.device):
        x = mn.xp.zeros((1, 1, 1, 1))
        y = mn(x)
    assert y.shape == (1, 3, 3, 3) and y.device == mn.device
    for where, a in arrays_of(mn):
        assert chainer.backend.get_device_from_array(a) == mn.device, where
