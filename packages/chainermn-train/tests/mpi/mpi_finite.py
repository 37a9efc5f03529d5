"""The multi-node optimizer's finite check on every rank (run under mpiexec at 1, 2 and 3 ranks)."""

import re

import chainer
import chainer.links as L
import numpy
import pytest

import chainermn_comm
import chainermn_train

COMM = chainermn_comm.create_communicator('naive')
X = numpy.ones((2, 4), numpy.float32)
T = numpy.zeros(2, numpy.int32)


def _setup(check_finite=None, dtype=numpy.float32, **kwargs):
    model = L.Classifier(L.Linear(4, 3, initialW=numpy.full((3, 4), 0.1, dtype)))
    model.predictor.b.array = model.predictor.b.array.astype(dtype)
    model.predictor.W.array = model.predictor.W.array.astype(dtype)
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(), COMM,
                                                      check_finite=check_finite, **kwargs)
    opt.setup(model)
    return model, opt


def _update(model, opt, poison=None):
    """One update; ``poison``: {rank: (param name, value)} written into that rank's gradient."""
    model.cleargrads()
    model(X.astype(model.predictor.W.dtype), T).backward()
    bad = (poison or {}).get(COMM.rank)
    if bad is not None:
        getattr(model.predictor, bad[0]).grad.reshape(-1)[1] = bad[1]
    opt.update()


def _finite(model):
    return all(bool(numpy.isfinite(p.array).all()) for p in model.params())


def _same_everywhere(model):
    rows = COMM.allgather_obj([p.array.copy() for _, p in sorted(model.namedparams())])
    return all(all(numpy.array_equal(a, b) for a, b in zip(rows[0], r)) for r in rows)


LAST = COMM.size - 1


def test_off_by_default_and_the_nan_spreads():
    model, opt = _setup()
    for it in range(3):
        _update(model, opt, {LAST: ('b', numpy.nan)} if it == 1 else None)
    assert opt.skipped_updates == 0 and opt.t == 3
    assert not _finite(model) and (COMM.size == 1 or not _finite(model))


@pytest.mark.parametrize('value', [numpy.nan, numpy.inf, -numpy.inf])
def test_skip_skips_that_update_on_every_rank(value):
    model, opt = _setup('skip')
    for it in range(4):
        _update(model, opt, {LAST: ('b', value)} if it == 1 else None)
    assert opt.skipped_updates == 1
    assert opt.t == 3                         # the skipped update did not count
    assert _finite(model) and _same_everywhere(model)


def test_raise_names_the_rank_and_parameter_on_every_rank():
    model, opt = _setup('raise')
    _update(model, opt)
    with pytest.raises(FloatingPointError) as e:
        _update(model, opt, {LAST: ('W', numpy.nan)})
    assert re.search(r"^rank {}: non-finite gradient at update 2: NaN or Inf in the local gradient of "
                     r"rank {} \(host [^)]+\) \(first in '/predictor/W'\); averaging would spread it "
                     r"to every rank \(check_finite='raise'\)$".format(COMM.rank, LAST), str(e.value)), \
        str(e.value)
    assert _finite(model) and opt.t == 1


def test_several_ranks_are_named_with_their_first_parameter():
    model, opt = _setup('raise')
    with pytest.raises(FloatingPointError) as e:
        _update(model, opt, {0: ('W', numpy.inf), LAST: ('b', numpy.nan)})
    text = str(e.value)
    if COMM.size == 1:  # rank 0 is the last rank: its poison is b's
        assert "rank 0 (host" in text and "(first in '/predictor/b')" in text
    else:
        assert re.search(r"rank 0 \(host [^)]+\) \(first in '/predictor/W'\), rank {} \(host [^)]+\) "
                         r"\(first in '/predictor/b'\)".format(LAST), text), text


def test_the_variable_turns_it_on(monkeypatch):
    monkeypatch.setenv('CHAINERMN_CHECK_FINITE', 'raise')
    model, opt = _setup()
    with pytest.raises(FloatingPointError, match='non-finite gradient'):
        _update(model, opt, {LAST: ('b', numpy.nan)})
    monkeypatch.setenv('CHAINERMN_CHECK_FINITE', 'skip')
    model, opt = _setup('off')   # the argument wins
    _update(model, opt, {LAST: ('b', numpy.nan)})
    assert opt.skipped_updates == 0 and not _finite(model)


def test_without_the_gathered_check_the_word_travels_by_itself():
    guard = COMM._guard
    saved = guard.check
    guard.check = False          # CHAINERMN_CHECK=0: no record to ride on
    try:
        model, opt = _setup('raise')
        with pytest.raises(FloatingPointError, match=r'rank {} \(host'.format(LAST)):
            _update(model, opt, {LAST: ('b', numpy.nan)})
    finally:
        guard.check = saved


def test_float16_gradients_that_are_only_large_are_finite():
    model, opt = _setup('raise', dtype=numpy.float16)
    model.cleargrads()
    model(X.astype(numpy.float16), T).backward()
    model.predictor.W.grad[...] = 60000   # finite, though its square overflows float16
    opt.update()
    assert opt.t == 1


def test_dynamic_loss_scaling_lowers_its_scale_on_the_skipped_update():
    model, opt = _setup('skip')
    opt.loss_scaling(interval=1000, scale=None)
    opt._loss_scale = scale = 8.0   # dynamic scaling starts at 1, which it cannot lower
    with pytest.warns(UserWarning, match='Non finite'):
        _update(model, opt, {LAST: ('b', numpy.nan)})
    assert opt.skipped_updates == 1 and opt._loss_scale == scale * 0.5
    assert _finite(model)


def test_it_needs_the_plain_update():
    with pytest.raises(ValueError, match=r"check_finite='skip' needs the plain update"):
        chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(), COMM, overlap=True,
                                                    check_finite='skip')
    with pytest.raises(ValueError, match=r"check_finite must be 'skip', 'raise', 'off' or None"):
        chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(), COMM, check_finite='yes')
