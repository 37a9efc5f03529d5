"""The trace recorder without MPI: the ring, the part and merged files, the straggler detector."""

import json
import logging
import os
import threading

import pytest

from chainermn_comm import log, protocol, settings
from chainermn_comm.guard import straggler
from chainermn_comm.trace import _export
from chainermn_comm.trace._ring import Ring
from chainermn_comm.trace._tracer import Tracer


def test_switches_are_declared_with_the_documented_defaults():
    assert settings.read('CHAINERMN_TRACE', environ={}) is None
    assert settings.read('CHAINERMN_TRACE_EVENTS', environ={}) == 200000
    assert settings.read('CHAINERMN_STRAGGLER', environ={}) is True
    assert settings.read('CHAINERMN_STRAGGLER', environ={'CHAINERMN_STRAGGLER': '0'}) is False
    with pytest.raises(ValueError, match='CHAINERMN_TRACE_EVENTS'):
        settings.read('CHAINERMN_TRACE_EVENTS', environ={'CHAINERMN_TRACE_EVENTS': '999'})
    for name in ('CHAINERMN_TRACE', 'CHAINERMN_TRACE_EVENTS', 'CHAINERMN_STRAGGLER'):
        assert name in protocol.VARIABLES


def test_ring_keeps_the_newest_events_and_counts_the_dropped():
    ring = Ring(1000)
    for i in range(2500):
        ring.add(('X', 'e{}'.format(i), 'comm', i, i + 1, 0, None))
    events, dropped = ring.snapshot()
    assert dropped == 1500 and len(events) == 1000
    assert events[0][1] == 'e1500' and events[-1][1] == 'e2499'


def test_ring_gives_threads_tracks_and_reuses_a_named_track_of_an_ended_thread():
    ring = Ring(1000)
    assert ring.tid() == 0 and ring.names[0] == 'main'
    got = []

    def worker():
        ring.name_thread('overlap')
        got.append(ring.tid())

    for _ in range(3):  # one thread per iteration, as the overlap path starts them
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert got == [1, 1, 1] and ring.names == {0: 'main', 1: 'overlap'}
    assert ring.track('overlap') == 2  # a track of its own for work on no thread (a CUDA stream)
    assert ring.track('overlap') == 2


def _tracer(tmp_path, rank, size, run='run-a', capacity=1000):
    t = Tracer(str(tmp_path), capacity, rank, size, 'host{}'.format(rank))
    t.run = run
    return t


def test_part_file_has_the_contract_fields(tmp_path):
    t = _tracer(tmp_path, 1, 2)
    t.clock.offset_us, t.clock.rtt_us = 12.5, 3.0
    t0 = 5_000_000
    t.ring.add(('X', 'allreduce_grad', 'comm', t0, t0 + 2000, 0,
                {'bytes': 64, 'dtype': 'float32', 'op': 'mean', 'call': 3, 'grad': True}))
    t.ring.add(('i', 'straggler', 'straggler', t0, t0, 0, {'rank': 1}))
    assert t.flush('exit') is None  # rank 0's part is missing: no merge on a normal exit
    with open(os.path.join(str(tmp_path), 'trace.rank1.json')) as f:
        doc = json.load(f)
    assert doc['chainermn_trace'] == 1 and doc['rank'] == 1 and doc['size'] == 2
    assert doc['host'] == 'host1' and doc['pid'] == os.getpid() and doc['reason'] == 'exit'
    assert doc['clock'] == {'offset_us': 12.5, 'rtt_us': 3.0, 'reference_rank': 0, 'estimated': False}
    assert doc['capacity'] == 1000 and doc['dropped'] == 0
    meta = [e for e in doc['traceEvents'] if e['ph'] == 'M']
    assert {(e['name'], json.dumps(e['args'])) for e in meta} == {
        ('process_name', '{"name": "rank 1 (host1)"}'), ('process_sort_index', '{"sort_index": 1}'),
        ('thread_name', '{"name": "main"}')}
    x, i = [e for e in doc['traceEvents'] if e['ph'] != 'M']
    assert x['pid'] == 1 and x['tid'] == 0 and x['cat'] == 'comm' and x['dur'] == pytest.approx(2.0)
    assert x['ts'] == pytest.approx((t0 + t.clock.base_ns) / 1000.0 + 12.5, abs=1e-3)
    assert x['args']['grad'] is True and x['args']['call'] == 3
    assert i['ph'] == 'i' and i['s'] == 'p' and 'dur' not in i


def test_the_last_part_merges_and_stale_parts_are_left_out(tmp_path):
    stale = _tracer(tmp_path, 2, 3, run='old-run')  # an earlier job's rank 2
    stale.ring.add(('X', 'old', 'comm', 0, 10, 0, None))
    stale.flush('exit')
    a, b = _tracer(tmp_path, 0, 2), _tracer(tmp_path, 1, 2)
    a.ring.add(('X', 'late', 'comm', 2_000_000, 2_001_000, 0, None))
    b.ring.add(('X', 'early', 'comm', 1_000_000, 1_001_000, 0, None))
    b.clock.base_ns = a.clock.base_ns
    assert a.flush('exit') is None
    path = b.flush('exit')
    assert path == os.path.join(str(tmp_path), 'trace.json')
    with open(path) as f:
        merged = json.load(f)
    assert merged['displayTimeUnit'] == 'ms'
    other = merged['otherData']
    assert other['chainermn_trace'] == 1 and other['size'] == 2 and sorted(other['ranks']) == ['0', '1']
    assert other['ranks']['1'] == {'host': 'host1', 'clock_offset_us': 0.0, 'clock_rtt_us': 0.0,
                                   'dropped': 0, 'capacity': 1000, 'reason': 'exit'}
    events = merged['traceEvents']
    phases = [e['ph'] for e in events]
    assert phases == sorted(phases, key=lambda p: p != 'M')  # metadata first
    names = [e['name'] for e in events if e['ph'] != 'M']
    assert names == ['early', 'late']  # sorted by ts, the stale run's event left out
    assert sum(e['name'] == 'process_name' for e in events) == 2


def test_other_reasons_merge_what_exists_and_the_first_reason_stays(tmp_path):
    t = _tracer(tmp_path, 1, 3)
    assert t.flush('exception') is not None
    assert t.flush('exit') is None  # parts of ranks 0 and 2 are missing
    with open(os.path.join(str(tmp_path), 'trace.json')) as f:
        merged = json.load(f)
    assert list(merged['otherData']['ranks']) == ['1']
    assert merged['otherData']['ranks']['1']['reason'] == 'exception'
    assert _export.merge(str(tmp_path)) is not None  # the public merge takes the newest run


def test_trace_directory_problems_name_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(protocol.TRUST_SHARED_ENV, raising=False)
    regular = tmp_path / 'f'
    regular.write_text('x')
    wide = tmp_path / 'wide'
    wide.mkdir()
    os.chmod(wide, 0o1777)
    made = tmp_path / 'new' / 'trace'
    problem = _export.directory_problem('CHAINERMN_TRACE', str(regular))
    assert problem.startswith("CHAINERMN_TRACE='{}' cannot be used: it is not a directory".format(regular))
    assert 'cannot create it' in _export.directory_problem('CHAINERMN_TRACE', '/proc/nope')
    assert 'other users can write it' in _export.directory_problem('CHAINERMN_TRACE', str(wide))
    assert _export.directory_problem('CHAINERMN_TRACE', str(made)) is None and made.is_dir()
    monkeypatch.setenv(protocol.TRUST_SHARED_ENV, '1')
    assert _export.directory_problem('CHAINERMN_TRACE', str(wide)) is None


def test_parts_that_are_links_are_not_merged(tmp_path):
    real = tmp_path / 'elsewhere.json'
    a = _tracer(tmp_path, 0, 2)
    _export.write_part(str(tmp_path), a.part_document())
    os.replace(os.path.join(str(tmp_path), 'trace.rank0.json'), str(real))
    os.symlink(str(real), os.path.join(str(tmp_path), 'trace.rank0.json'))
    assert _export.read_parts(str(tmp_path)) == []


def test_dropped_events_are_written(tmp_path):
    t = _tracer(tmp_path, 0, 1)
    for i in range(1200):
        t.ring.add(('X', 'e', 'comm', i, i + 1, 0, None))
    t.flush('exit')
    with open(os.path.join(str(tmp_path), 'trace.json')) as f:
        merged = json.load(f)
    assert merged['otherData']['ranks']['0']['dropped'] == 200
    assert sum(e['ph'] == 'X' for e in merged['traceEvents']) == 1000


# -- live straggler detection -------------------------------------------------------------------
def _observe(det, rows, period=0.1):
    lines = []
    for n, words in enumerate(rows):
        line = det.observe(words, n * period)
        if line:
            lines.append(line)
    return lines


def test_a_rank_late_at_most_updates_is_named_once_with_the_exact_line(caplog):
    det = straggler.Detector(['a', 'b', 'c'])
    rows = [[20000, 50000, 21000]] * 80  # rank 1 is 29.5 ms past the median of each 100 ms update
    with caplog.at_level(logging.WARNING, logger='chainermn.straggler'):
        lines = _observe(det, rows)
    assert lines == ['chainermn: straggler: rank 1 (host b) arrives 29.0 ms after the median at 26 '
                     'of the last 26 updates']
    assert [r.getMessage() for r in caplog.records] == lines
    assert caplog.records[0].name == 'chainermn.straggler'


def test_balanced_and_occasionally_late_ranks_are_not_named():
    det = straggler.Detector(['a', 'b'])
    assert _observe(det, [[10000, 11000]] * 100) == []      # 0.5 ms late: below 20% of 100 ms
    det = straggler.Detector(['a', 'b', 'c'])
    rows = [[10000, 60000, 10000] if n % 2 else [10000, 10000, 10000] for n in range(200)]
    assert _observe(det, rows) == []                         # late at half the updates: not more
    det = straggler.Detector(['a', 'b'])
    assert _observe(det, [[-1, 50000]] * 100) == []          # no previous collective: no word


def test_the_default_handler_prints_the_straggler_line_as_it_is(capfd):
    root = logging.getLogger()
    saved = list(root.handlers)
    root.handlers[:] = []
    try:
        straggler.Detector(['h0', 'h1'])._name(1, [40000.0, 41000.0, 42000.0])
    finally:
        root.handlers[:] = saved
    err = capfd.readouterr().err
    assert err == ('chainermn: straggler: rank 1 (host h1) arrives 41.0 ms after the median at 3 of '
                   'the last 0 updates\n'), err
    assert log.LOGGER_NAME == 'chainermn'
