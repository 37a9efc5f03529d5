"""The report's analysis on synthetic traces (trace_synth.py): values per rank, overlap, bandwidth, stragglers."""

import json
import os
import sys
import types

import pytest

import trace_synth
from chainermn_tools.trace import report
from chainermn_tools.trace._analyse import analyse, median, p95
from chainermn_tools.trace._intervals import union
from chainermn_tools.trace._load import TraceMissing, load
from chainermn_tools.trace._text import render

MIB = 2 ** 20


@pytest.fixture(autouse=True)
def no_comm_merge(monkeypatch):
    """Read the parts directly unless a test installs a merge (comm's may or may not exist)."""
    monkeypatch.setitem(sys.modules, 'chainermn_comm.trace', None)


def analysed(tmp_path, merged=False, **kwargs):
    parts = trace_synth.make(**kwargs)
    (trace_synth.write_merged if merged else trace_synth.write_parts)(tmp_path, parts)
    return report(str(tmp_path))


def medians(stats):
    return {k: round(median(v), 6) for k, v in stats.per_iter.items()}


def test_interval_sets():
    a = union([(5, 7), (0, 2), (1, 3), (10, 10), (6, 9)])
    assert a.pairs() == [(0, 3), (5, 9)] and a.measure() == 7
    assert a.measure(2, 6) == 2 and a.measure(3, 5) == 0 and a.measure(-1, 100) == 7
    assert a.measure(6, 8) == 2 and a.measure(0.5, 1.5) == 1
    b = union([(1, 2), (4, 6), (8, 20)])
    assert (a - b).pairs() == [(0, 1), (2, 3), (6, 8)]
    assert (b - a).pairs() == [(4, 5), (9, 20)]
    assert (a | b).pairs() == [(0, 3), (4, 20)]
    assert (a - union([])).pairs() == a.pairs() and (union([]) - a).pairs() == []


def test_balanced_run_per_category_and_nobody_named(tmp_path):
    rep = analysed(tmp_path, ranks=3, iterations=20)
    assert [s.rank for s in rep.ranks] == [0, 1, 2]
    for s in rep.ranks:
        assert len(s.windows) == 20 and s.host == 'node0'
        # data 5 + forward 10 + backward 20 + all-reduce 4 + optimizer 2
        assert medians(s) == {'iteration': 41.0, 'compute': 32.0, 'comm': 4.0, 'wait': 0.0,
                              'data': 5.0, 'io': 0.0, 'eval': 0.0, 'other': 0.0}
        assert s.hidden == pytest.approx(0.0, abs=1e-9)
        assert s.bandwidth == pytest.approx([4 * MIB / 4e-3 / 1e9] * 20, rel=1e-6)
    assert rep.median_iteration_ms == pytest.approx(41.0)
    assert rep.stragglers == []
    assert rep.best_bandwidth[0] == pytest.approx(1.048576, rel=1e-6)
    text = render(rep)
    assert 'straggler: rank' not in text and 'stragglers: none' in text, text


def test_p95_against_median(tmp_path):
    rep = analysed(tmp_path, ranks=2, iterations=20, data=lambda r, i: 15.0 if i == 19 else 5.0,
                   io=lambda r, i: 8.0 if i % 5 == 4 else 0.0)
    for s in rep.ranks:
        assert median(s.per_iter['data']) == pytest.approx(5.0)
        # 19 values of 5 and one of 15: the 95th percentile lies 5% of the way from 5 to 15
        assert p95(s.per_iter['data']) == pytest.approx(5.5)
        assert median(s.per_iter['io']) == pytest.approx(0.0)
        assert p95(s.per_iter['io']) == pytest.approx(8.0)  # 4 of 20 iterations save
        # 16 iterations of 41 ms, 3 of 49 (io), one of 59 (io and the slow batch)
        assert p95(s.per_iter['iteration']) == pytest.approx(49.5)


def test_io_and_eval_are_taken_out_of_data(tmp_path):
    rep = analysed(tmp_path, ranks=2, iterations=6, io=2.5, evaluate=3.0, gap=1.5)
    for s in rep.ranks:
        m = medians(s)
        assert (m['data'], m['io'], m['eval'], m['other']) == (5.0, 2.5, 3.0, 1.5), m
        assert m['iteration'] == pytest.approx(41.0 + 2.5 + 3.0 + 1.5)
        total = sum(m[c] for c in ('compute', 'wait', 'comm', 'io', 'eval', 'data', 'other'))
        assert total == pytest.approx(m['iteration'])


@pytest.mark.parametrize('buckets,transfer,exposed,hidden', [(2, 12.0, 6.0, 0.5), (4, 16.0, 4.0, 0.75)])
def test_overlapped_buckets_exposed_and_hidden(tmp_path, buckets, transfer, exposed, hidden):
    # Bucket k is ready after (k+1)/buckets of backward (20 ms); each takes transfer/buckets: all
    # but the last run behind backward, the last one after it.
    rep = analysed(tmp_path, ranks=2, iterations=10, buckets=buckets, transfer=transfer)
    for s in rep.ranks:
        assert s.main_tid == 0
        m = medians(s)
        assert m['comm'] == pytest.approx(exposed) and m['wait'] == 0.0 and m['compute'] == 32.0
        assert s.comm_ms == pytest.approx(10 * transfer)
        assert s.hidden == pytest.approx(hidden)
        assert median(s.bandwidth) == pytest.approx(4 * MIB / buckets / (transfer / buckets * 1e3) / 1e3)


def test_straggler_in_data_is_named_with_host_and_category(tmp_path):
    rep = analysed(tmp_path, ranks=3, iterations=20, hosts=['node0', 'node0', 'node1'],
                   slow_rank=2, slow=15.0, slow_in='data')
    (s,) = rep.stragglers
    assert (s.rank, s.host, s.count, s.updates, s.category) == (2, 'node1', 20, 20, 'data')
    assert s.late_ms == pytest.approx(15.0) and s.extra_ms == pytest.approx(15.0)
    for other in rep.ranks[:2]:
        assert median(other.per_iter['wait']) == pytest.approx(15.0)
    assert median(rep.ranks[2].per_iter['wait']) == pytest.approx(0.0)
    line = ('straggler: rank 2 (node1) arrives 15.0 ms after the median at 20 of 20 updates; its '
            'extra time is in data (+15.0 ms per iteration against the median rank)')
    assert line in render(rep).splitlines()


def test_straggler_in_compute_with_overlap(tmp_path):
    rep = analysed(tmp_path, ranks=4, iterations=12, buckets=3, transfer=12.0, slow_rank=1,
                   slow=12.0, slow_in='forward')
    (s,) = rep.stragglers
    assert (s.rank, s.category, s.count, s.updates) == (1, 'compute', 12, 12)
    assert s.extra_ms == pytest.approx(12.0) and s.late_ms == pytest.approx(12.0)


def test_two_ranks_the_slow_one_is_late_by_the_whole_gap(tmp_path):
    rep = analysed(tmp_path, ranks=2, iterations=10, slow_rank=1, slow=20.0, slow_in='data')
    (s,) = rep.stragglers
    assert s.rank == 1 and s.late_ms == pytest.approx(20.0) and s.extra_ms == pytest.approx(20.0)


@pytest.mark.parametrize('late_every,named', [(2, False), (3, True)])
def test_late_at_more_than_half_of_the_updates(tmp_path, late_every, named):
    # late_every=2: late at 10 of 20 updates (half: nobody); 3: late at 13 of 20 (named).
    def data(r, i):
        return 35.0 if r == 1 and i % late_every != 0 else 5.0
    rep = analysed(tmp_path, ranks=3, iterations=20, data=data)
    if named:
        (s,) = rep.stragglers
        assert (s.rank, s.count, s.updates, s.category) == (1, 13, 20, 'data')
        assert s.late_ms == pytest.approx(30.0)
    else:
        assert rep.stragglers == []


def test_small_lateness_is_no_straggler(tmp_path):
    # 5 ms late with a 46 ms iteration: under 20% of it
    rep = analysed(tmp_path, ranks=3, iterations=10, slow_rank=0, slow=5.0)
    assert rep.stragglers == [] and rep.median_iteration_ms == pytest.approx(46.0)


def test_merged_file_gives_the_same_report_as_the_parts(tmp_path):
    kwargs = dict(ranks=3, iterations=8, slow_rank=1, slow=20.0, buckets=2, transfer=8.0)
    (tmp_path / 'a').mkdir()
    (tmp_path / 'b').mkdir()
    a = analysed(tmp_path / 'a', merged=False, **kwargs)
    b = analysed(tmp_path / 'b', merged=True, **kwargs)
    assert b.trace.source.endswith('trace.json') and 'part file' in a.trace.source
    assert [s.per_iter for s in a.ranks] == [s.per_iter for s in b.ranks]
    assert a.stragglers == b.stragglers and len(a.stragglers) == 1
    assert b.trace.threads[(0, 1)] == 'overlap' and b.ranks[2].host == 'node0'


def test_stale_merge_is_redone_by_comm_or_read_from_the_parts(tmp_path, monkeypatch):
    parts = trace_synth.make(ranks=2, iterations=4)
    merged = trace_synth.write_merged(tmp_path, trace_synth.make(ranks=2, iterations=2))
    paths = trace_synth.write_parts(tmp_path, parts)
    os.utime(merged, (1, 1))  # older than the parts: stale
    rep = report(str(tmp_path))  # comm's merge is not importable here: the parts are read
    assert 'part file' in rep.trace.source and len(rep.ranks[0].windows) == 4
    calls = []

    def merge(directory):
        calls.append(directory)
        trace_synth.write_merged(directory, parts)
    monkeypatch.setitem(sys.modules, 'chainermn_comm.trace', types.SimpleNamespace(merge=merge))
    rep = report(str(tmp_path))
    assert calls == [str(tmp_path)] and rep.trace.source == merged
    assert len(rep.ranks[0].windows) == 4
    os.utime(merged, (1, 1))

    def broken(directory):
        raise RuntimeError('part 1 is truncated')
    monkeypatch.setitem(sys.modules, 'chainermn_comm.trace', types.SimpleNamespace(merge=broken))
    with pytest.warns(UserWarning, match='part 1 is truncated'):
        rep = report(str(tmp_path))
    assert 'part file' in rep.trace.source and len(paths) == 2


def test_notes_for_dropped_events_and_missing_parts(tmp_path):
    parts = trace_synth.make(ranks=3, iterations=5, dropped=1234)
    del parts[2]
    trace_synth.write_parts(tmp_path, parts)
    rep = report(str(tmp_path))
    assert [s.rank for s in rep.ranks] == [0, 1]
    text = render(rep)
    assert 'note: no events from rank(s) 2 of 3 (their part files are missing)' in text
    assert 'note: rank 0 dropped its 1234 oldest events' in text


def test_what_is_missing_is_said(tmp_path):
    with pytest.raises(TraceMissing, match='holds no trace: neither trace.json nor part files'):
        load(str(tmp_path))
    with pytest.raises(TraceMissing, match='does not exist'):
        load(str(tmp_path / 'nowhere'))
    (tmp_path / 'trace.rank0.json').write_text('{"traceEvents": [')
    with pytest.raises(TraceMissing, match='cannot read .*trace.rank0.json'):
        load(str(tmp_path))
    doc = trace_synth.make(ranks=1, iterations=2)[0]
    doc['traceEvents'] = [e for e in doc['traceEvents'] if e.get('cat') != 'step']
    (tmp_path / 'trace.rank0.json').write_text(json.dumps(doc))
    with pytest.raises(ValueError, match='no "step" events'):
        analyse(load(str(tmp_path)))
