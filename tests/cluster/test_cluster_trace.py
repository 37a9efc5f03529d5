"""Tracing and live straggler detection across two nodes of a cluster of namespaces (issue 34).

Each node is its own host (hostname, network, IPC, PID namespace), so the clock estimate runs
over the cluster's links and the straggler line names the slow rank's node.
"""

import json
import os
import re
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, 'packages', 'chainermn-train', 'tests', 'mpi', 'trace_train.py')
LINE = re.compile(r'^chainermn: straggler: rank (\d+) \(host (\S+)\) arrives ([0-9.]+) ms after the '
                  r'median at (\d+) of the last (\d+) updates$', re.M)


@pytest.fixture(autouse=True)
def _real_nodes(monkeypatch):
    monkeypatch.delenv('CHAINERMN_RANKS_PER_NODE', raising=False)


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-6000:], res.stderr[-12000:])


def test_trace_and_straggler_across_two_nodes(cluster2, tmp_path, record_figure):
    trace_dir = tmp_path / 'trace'
    res = cluster2.mpiexec([SCRIPT, tmp_path / 'out', 40, '--slow-rank', '1', '--sleep', '0.03'],
                           ranks_per_node=1, timeout=240, env={'CHAINERMN_TRACE': str(trace_dir)})
    assert res.returncode == 0 and not res.timed_out, report(res)
    found = LINE.findall(res.stderr)
    assert len(found) == 1, report(res)
    rank, host, late, count, window = found[0]
    assert (rank, host) == ('1', 'node1') and float(late) >= 15, report(res)
    assert 26 <= int(count) <= int(window) <= 50, report(res)

    with open(str(trace_dir / 'trace.json')) as f:
        doc = json.load(f)
    ranks = doc['otherData']['ranks']
    assert {r: v['host'] for r, v in ranks.items()} == {'0': 'node0', '1': 'node1'}
    assert all(v['reason'] == 'exit' and v['dropped'] == 0 for v in ranks.values())
    # The nodes share this machine's clock: the estimate over the link must find (almost) none.
    rtt, offset = ranks['1']['clock_rtt_us'], ranks['1']['clock_offset_us']
    assert 0 < rtt < 5000 and abs(offset) <= rtt / 2 + 100, ranks['1']
    record_figure('trace clock estimate across the link', rtt / 1e6,
                  'round trip {:.1f} us, offset {:.1f} us'.format(rtt, offset))
    events = doc['traceEvents']
    names = {e['pid']: e['args']['name'] for e in events if e['name'] == 'process_name'}
    assert names == {0: 'rank 0 (node0)', 1: 'rank 1 (node1)'}
    grads = [e for e in events if e['name'] == 'allreduce_grad']
    assert len(grads) == 80 and all(e['args']['grad'] is True for e in grads)
    spreads = []
    for call in {e['args']['call'] for e in grads}:
        ends = [e['ts'] + e['dur'] for e in grads if e['args']['call'] == call]
        waits = [e for e in events if e['name'] == 'wait' and e['args']['call'] == call]
        assert len(ends) == 2 and len(waits) == 2
        # One clock across the nodes: nobody leaves the check before both have arrived ...
        assert min(w['ts'] + w['dur'] for w in waits) >= max(w['ts'] for w in waits) - 50, waits
        spreads.append(max(ends) - min(ends))
    assert statistics.median(spreads) < 1000, spreads  # ... and the ends agree
    # Rank 0 waits for the slow rank inside the check: its waits are the long ones.
    waits = {r: statistics.median(e['dur'] for e in events if e['name'] == 'wait' and e['pid'] == r
                                  and e['args']['collective'] == 'allreduce_grad') for r in (0, 1)}
    assert waits[0] > 20000 > waits[1], waits
    assert [e['args']['rank'] for e in events if e['name'] == 'straggler'] == [1]

    # The report reads the same files and names the same rank, its node and where its time goes.
    rep = subprocess.run([sys.executable, '-m', 'chainermn', 'trace', str(trace_dir)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = rep.stdout.decode(errors='replace')
    assert rep.returncode == 0, out
    named = re.findall(r'^straggler: rank (\d+) \((\S+)\) arrives .* its extra time is in (\w+)', out,
                       re.M)
    assert named == [('1', 'node1', 'data')], out
    assert (trace_dir / 'trace.png').stat().st_size > 20000
