"""Per-rank trace tests (run under mpiexec by test_trace_mpi.py).

With $CHAINERMN_TRACE set, every rank records; the tests flush and read the files.  Without it,
nothing is recorded.  With $CHAINERMN_TEST_GPU_COMMS (the NumPy stand-in for CuPy on the path),
the GPU communicators' gradient all-reduce is timed with CUDA events.
"""

import json
import os
import sys

import numpy
import pytest

import chainermn_comm
from chainermn_comm import trace

TRACE_DIR = os.environ.get('CHAINERMN_TRACE')
GPU_COMMS = [n for n in os.environ.get('CHAINERMN_TEST_GPU_COMMS', '').split(',') if n]
traced = pytest.mark.skipif(not TRACE_DIR, reason='needs CHAINERMN_TRACE')
_comm = []


def comm():
    if not _comm:
        _comm.append(chainermn_comm.create_communicator('naive'))
    return _comm[0]


def _events(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.skipif(bool(TRACE_DIR), reason='CHAINERMN_TRACE is set')
def test_unset_records_nothing():
    c = comm()
    c.allreduce(numpy.ones(4))
    c.bcast_obj('x')
    assert trace.ON is False and trace.enabled() is False and trace.directory() is None
    assert trace.flush('exit') is None
    with trace.span('checkpoint save', 'io'):
        pass
    assert trace.begin() is None


@traced
@pytest.mark.skipif(bool(GPU_COMMS), reason='host collectives')
def test_collectives_are_events_on_one_clock():
    from mpi4py import MPI
    c = comm()
    assert trace.ON and trace.directory() == os.path.abspath(TRACE_DIR)
    for i in range(30):
        c.allreduce(numpy.full(16, float(i), numpy.float32))  # 64 bytes: fused in the check
        c.bcast_obj(i)
    trace.instant('tune', 'tune', {'chunk_bytes': 1})
    merged = trace.flush('exit')
    MPI.COMM_WORLD.Barrier()  # every part is written, and the last rank merged them
    path = os.path.join(TRACE_DIR, 'trace.json')
    assert merged in (None, path) and os.path.exists(path)
    doc = _events(path)
    part = _events(os.path.join(TRACE_DIR, 'trace.rank{}.json'.format(c.rank)))
    assert part['rank'] == c.rank and part['size'] == c.size and part['reason'] == 'exit'
    assert part['clock']['estimated'] is True and part['clock']['reference_rank'] == 0
    ranks = doc['otherData']['ranks']
    assert sorted(int(r) for r in ranks) == list(range(c.size))
    # One host: rank 0's clock is every rank's clock, so the estimate is off by little.
    for r, info in ranks.items():
        assert abs(info['clock_offset_us']) < 1000, (r, info)
        assert (info['clock_rtt_us'] == 0) == (r == '0'), (r, info)
    names = [e for e in doc['traceEvents'] if e['ph'] == 'M' and e['name'] == 'process_name']
    assert sorted(e['pid'] for e in names) == list(range(c.size))
    assert all(e['args']['name'] == 'rank {} ({})'.format(e['pid'], MPI.Get_processor_name())
               for e in names)
    comm_events = [e for e in doc['traceEvents'] if e.get('cat') == 'comm']
    reduces = [e for e in comm_events if e['name'] == 'allreduce']
    assert len(reduces) == 30 * c.size
    assert all(e['args']['bytes'] == 64 and e['args']['dtype'] == 'float32' and
               e['args']['op'] == 'sum' for e in reduces)
    calls = sorted({e['args']['call'] for e in comm_events})
    assert calls == list(range(1, 61))
    waits = [e for e in doc['traceEvents'] if e.get('cat') == 'wait']
    assert len(waits) == (60 * c.size if c.size > 1 else 0)  # one rank: nothing to agree on
    by_call = {(e['pid'], e['args']['call']): e for e in comm_events}
    for w in waits:
        outer = by_call[(w['pid'], w['args']['call'])]
        assert outer['ts'] <= w['ts'] + 1 and w['ts'] + w['dur'] <= outer['ts'] + outer['dur'] + 1
        assert w['args']['collective'] == outer['name']
    if c.size > 1:
        # On one clock no rank leaves a collective's check before every rank has arrived at it
        # (the all-gather needs them all), whatever the scheduling ...
        spreads = []
        for call in calls:
            ends = [e['ts'] + e['dur'] for e in comm_events if e['args']['call'] == call]
            arrivals = [w['ts'] for w in waits if w['args']['call'] == call]
            left = [w['ts'] + w['dur'] for w in waits if w['args']['call'] == call]
            assert min(left) >= max(arrivals) - 50, (call, arrivals, left)
            spreads.append(max(ends) - min(ends))
        # ... and the same collective ends at about the same moment on every rank (a quarter of
        # them within 1 ms: on 2 loaded cores a rank is often descheduled as it leaves a call).
        spreads.sort()
        assert spreads[len(spreads) // 4] < 1000, spreads
    tune = [e for e in doc['traceEvents'] if e['name'] == 'tune']
    assert len(tune) == c.size and all(e['ph'] == 'i' for e in tune)


@traced
@pytest.mark.skipif(not GPU_COMMS, reason='needs the GPU communicators (stand-in)')
@pytest.mark.parametrize('name', GPU_COMMS)
def test_gpu_gradient_allreduce_is_timed_on_the_device(name):
    import cupy
    from mpi4py import MPI
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from mpi_gpu import _model, get  # the GPU tests' communicators and model of CuPy arrays
    c = get(name)
    waits_before = cupy.cuda.Event.waits
    for _ in range(5):
        c.allreduce_grad(_model(c.rank))
    # One wait ever (the anchor of the device clock); the pairs resolve as they complete.
    assert cupy.cuda.Event.waits - waits_before <= 1
    trace.flush('exit')
    MPI.COMM_WORLD.Barrier()
    part = _events(os.path.join(TRACE_DIR, 'trace.rank{}.json'.format(c.rank)))
    grads = [e for e in part['traceEvents'] if e['name'] == 'allreduce_grad' and e.get('cat') == 'comm']
    assert len(grads) >= 5
    for e in grads[-5:]:
        assert e['args']['device'] is True and e['args']['grad'] is True
        assert e['args']['bytes'] == 4 * (12 + 17 + 30 + 0 + 1000) and e['args']['dtype'] == 'float32'
        assert e['dur'] >= 0
