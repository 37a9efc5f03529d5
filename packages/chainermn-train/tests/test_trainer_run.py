"""Trainer.run the job's way, in one process: the loop's error printed once, information held."""

import io
import logging
import sys

import chainer
import numpy
import pytest
from chainer.training import extensions

from chainermn_comm import log, voice
from chainermn_train import _trainer_run


def _trainer(tmp_path, fail=False, report=False):
    model = chainer.links.Linear(2, 1)
    opt = chainer.optimizers.SGD()
    opt.setup(model)
    data = [numpy.ones(2, numpy.float32)] * 4
    it = chainer.iterators.SerialIterator(data, 2)
    updater = chainer.training.StandardUpdater(it, opt, loss_func=lambda x: chainer.functions.sum(model(x)))
    trainer = chainer.training.Trainer(updater, (3, 'iteration'), out=str(tmp_path))

    def step(t):
        log.get_logger('tune').info('chosen at %d', t.updater.iteration)
        if fail and t.updater.iteration == 2:
            raise ValueError('planned')
    trainer.extend(step, trigger=(1, 'iteration'))
    if report:
        trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
        trainer.extend(extensions.PrintReport(['iteration', 'main/loss'], out=sys.stdout))
    return trainer


class _PlainLogging:
    """The default handler writes: pytest's own root handlers are removed for a block."""

    def __enter__(self):
        _trainer_run.install()
        root = logging.getLogger()
        self.saved = list(root.handlers)
        root.handlers[:] = []

    def __exit__(self, *exc):
        logging.getLogger().handlers[:] = self.saved


@pytest.fixture
def plain_logging():
    return _PlainLogging()


def test_the_loop_s_error_is_printed_once_with_its_type(tmp_path, plain_logging, capsys):
    trainer = _trainer(tmp_path, fail=True)
    with plain_logging, pytest.raises(ValueError) as e:
        trainer.run()
    err = capsys.readouterr().err
    assert err.count('Exception in main training loop: ValueError: planned\n') == 1, err
    assert err.count('Traceback (most recent call last):') == 1, err
    assert voice.decide(e.value) == 'shown'   # so the uncaught-exception hook says nothing more
    printed = []
    voice.report_uncaught(ValueError, e.value, e.value.__traceback__, lambda *a: printed.append(a))
    assert printed == []


def test_without_the_message_nothing_is_printed(tmp_path, plain_logging, capsys):
    with plain_logging, pytest.raises(ValueError) as e:
        _trainer(tmp_path, fail=True).run(show_loop_exception_msg=False)
    assert 'Exception in main training loop' not in capsys.readouterr().err
    assert voice.decide(e.value) == 'report'


def test_information_waits_for_the_end_of_a_run_that_prints_a_table(tmp_path, plain_logging, monkeypatch):
    both = io.StringIO()   # stdout and stderr in one stream, as on a terminal
    monkeypatch.setattr(sys, 'stdout', both)
    monkeypatch.setattr(sys, 'stderr', both)
    with plain_logging:
        _trainer(tmp_path, report=True).run()
    lines = [line.replace('\x1b[J', '') for line in both.getvalue().splitlines()]
    assert lines[0].startswith('iteration') and [line.split()[0] for line in lines[1:4]] == ['1', '2', '3']
    assert [line.split('] ')[1] for line in lines[4:]] == ['chosen at {}'.format(i) for i in (1, 2, 3)], lines
    # A run whose loop fails writes what it held before its report.
    both.seek(0)
    both.truncate()
    with plain_logging, pytest.raises(ValueError):
        _trainer(tmp_path / 'b', fail=True, report=True).run()
    text = both.getvalue()
    assert text.index('chosen at 2') < text.index('Exception in main training loop'), text


def test_install_is_idempotent():
    _trainer_run.install()
    wrapped = chainer.training.Trainer.run
    _trainer_run.install()
    assert chainer.training.Trainer.run is wrapped and wrapped.__name__ == 'run'
    assert sys.modules['chainermn_train._trainer_run']._state['original'] is not wrapped
