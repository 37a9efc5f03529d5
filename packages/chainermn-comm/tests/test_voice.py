"""One voice, in one process: warnings shown by rank 0 only, errors printed the job's way."""

import sys
import traceback
import warnings

import pytest

from chainermn_comm import voice


class _Boom(ValueError):
    pass


def _raised(exc):
    try:
        raise exc
    except Exception as e:
        return e, e.__traceback__


def test_warn_all_shows_on_rank_0_only():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        voice.warn_all('said once', UserWarning, rank=0)
        voice.warn_all('said once', UserWarning, rank=1)
    assert [str(w.message) for w in caught] == ['said once']
    assert caught[0].filename == __file__   # stacklevel: the caller's line


@pytest.mark.parametrize('rank', [0, 1, 2])
def test_warn_all_raises_on_every_rank_under_an_error_filter(rank):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with pytest.raises(UserWarning, match='said once'):
            voice.warn_all('said once', UserWarning, rank=rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('ignore')
        voice.warn_all('said once', UserWarning, rank=rank)
    assert caught == []


def test_agreed_errors_are_reported_by_their_reporter(monkeypatch):
    monkeypatch.setattr(voice, 'world_rank', lambda: 1)
    mine = voice.agreed(_Boom('x'))        # no communicator: world rank 0 reports it
    assert voice.reporter_of(mine) == 0 and voice.decide(mine) == 'pointer'
    assert voice.pointer_line(mine) == '_Boom, raised by every rank together: rank 0 reports it'
    assert voice.decide(_Boom('one rank')) == 'report'
    monkeypatch.setattr(voice, 'world_rank', lambda: 0)
    assert voice.decide(mine) == 'report'
    voice.mark_shown(mine)
    assert voice.decide(mine) == 'shown'


def test_report_uncaught(monkeypatch, capsys):
    printed = []
    fallback = lambda *args: printed.append(args)   # noqa: E731
    exc, tb = _raised(_Boom('own'))
    monkeypatch.setattr(voice, 'world_rank', lambda: 2)
    assert voice.report_uncaught(_Boom, exc, tb, fallback) == 'report'
    assert printed == [(_Boom, exc, tb)]
    agreed, tb = _raised(voice.agreed(_Boom('all')))
    assert voice.report_uncaught(_Boom, agreed, tb, fallback) == 'pointer'
    assert len(printed) == 1
    voice.mark_shown(exc)
    assert voice.report_uncaught(_Boom, exc, tb, fallback) == 'shown' and len(printed) == 1
    # The default hook's report is written with one call (other ranks' lines land around it).
    exc, tb = _raised(_Boom('whole'))
    writes = []
    monkeypatch.setattr(sys, 'stderr', type('W', (), {'write': lambda self, t: writes.append(t),
                                                      'flush': lambda self: None})())
    voice.report_uncaught(_Boom, exc, tb, sys.__excepthook__)
    assert writes == [''.join(traceback.format_exception(_Boom, exc, tb))]


def test_early_report(monkeypatch, capsys, caplog):
    monkeypatch.setattr(voice, 'world_rank', lambda: 0)
    exc, tb = _raised(voice.agreed(_Boom('every rank')))
    voice.early_report(exc, tb)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == 'Exception in main training loop: _Boom: every rank'
    assert lines[1] == 'Traceback (most recent call last):' and 'in _raised' in err
    assert lines[-1] == 'Will finalize trainer extensions and updater before reraising the exception.'
    assert voice.decide(exc) == 'shown'
    monkeypatch.setattr(voice, 'world_rank', lambda: 1)
    exc, tb = _raised(voice.agreed(_Boom('every rank')))
    voice.early_report(exc, tb)
    assert capsys.readouterr().err == ''
    assert [r.getMessage() for r in caplog.records] == [
        '_Boom in the main training loop, raised by every rank together: rank 0 reports it']


def test_install_wraps_the_hook_once(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, 'excepthook', lambda *a: seen.append(a))
    monkeypatch.setitem(voice._hook, 'previous', None)
    voice.install()
    voice.install()
    assert sys.excepthook is voice._excepthook and voice._hook['previous'] is not voice._excepthook
    exc, tb = _raised(_Boom('x'))
    sys.excepthook(_Boom, exc, tb)
    assert seen == [(_Boom, exc, tb)]
