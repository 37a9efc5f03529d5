"""Bad-input suite: every case ends within 20 s with a clear error on every rank, or its documented result.

The batched cases (``cases.py``) share one mpiexec job per rank count; the stall case needs a job
of its own because it ends the job.  Each test writes its rows of the results table (case, what
each rank prints, seconds to the end) to ``$CHAINERMN_TEST_BAD_INPUT_TABLE`` when set (appending), and
prints them (``pytest -s`` shows them).
"""

import json
import os
import re

import pytest

from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, 'cases.py')
LIMIT_S = 20.0
TABLE_ENV = 'CHAINERMN_TEST_BAD_INPUT_TABLE'


def _load_cases():
    import importlib.util
    spec = importlib.util.spec_from_file_location('bad_input_cases', CASES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _first_line(text, width=240):
    """Return the first line of an error and the line naming the difference, shortened."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    keep = lines[:1] + [line for line in lines[1:] if line.startswith(('First difference', 'Invalid input'))]
    if len(keep) == 1:  # no single difference to name (e.g. different calls): show every rank's call
        keep += [line for line in lines[1:] if line.startswith('rank ') and 'collective call #' in line]
    text = ' / '.join(keep)
    return text if len(text) <= width else text[:width - 3] + '...'


def _write_rows(rows):
    text = ''.join('| {} | {} | {} | {} | {:.2f} |\n'.format(*r) for r in rows)
    print('\n' + text)
    path = os.environ.get(TABLE_ENV)
    if path:
        with open(path, 'a') as f:
            f.write(text)


def test_there_are_at_least_25_cases_in_every_area():
    mod = _load_cases()
    areas = {c['area'] for c in mod.CASES}
    assert len(mod.CASES) >= 25
    assert {'collectives', 'data', 'links', 'train', 'environment'} <= areas


@pytest.mark.parametrize('n', [2, 3])
def test_batched_cases(n):
    mod = _load_cases()
    res = run_mpi([CASES], n, timeout=300, cwd=HERE)
    report = 'status {} after {:.1f}s\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, res.stdout[-20000:], res.stderr[-20000:])
    assert not res.timed_out, report
    assert res.returncode == 0, report
    outcomes = {}
    for line in res.stdout.splitlines():
        if line.startswith('BADINPUT '):
            o = json.loads(line[len('BADINPUT '):])
            outcomes.setdefault(o['case'], {})[o['rank']] = o
    rows, failures = [], []
    for entry in mod.CASES:
        got = outcomes.get(entry['name'], {})
        if sorted(got) != list(range(n)):
            failures.append('{}: ranks {} reported (want all {})'.format(entry['name'], sorted(got), n))
            continue
        for r in range(n):
            why = mod.check(entry, got[r])
            if why:
                failures.append('{} rank {}: {}'.format(entry['name'], r, why))
        seconds = max(o['seconds'] for o in got.values())
        if seconds > LIMIT_S:
            failures.append('{}: took {:.1f} s (limit {} s)'.format(entry['name'], seconds, LIMIT_S))
        for r in range(n):
            o = got[r]
            shown = '{}: {}'.format(o['type'], _first_line(o['message'])) if o['type'] else \
                'returned ' + o['message']
            rows.append((entry['name'] if r == 0 else '', entry['area'] if r == 0 else '', n, r,
                         seconds if r == 0 else o['seconds'], shown))
    _write_rows([(a, b, 'n={} rank {}'.format(c, d), f.replace('|', '\\|'), e) for a, b, c, d, e, f in rows])
    assert not failures, '\n'.join(failures) + '\n' + report


STALL_SCRIPT = '''
import numpy, chainermn
comm = chainermn.create_communicator('naive')
comm.allreduce(numpy.ones(1))
if comm.rank == comm.size - 1:
    comm.recv(source=0, tag=9)        # forgot the allreduce: waits for a message nobody sends
else:
    comm.allreduce(numpy.ones(1))
'''


@pytest.mark.parametrize('n', [2, 3])
def test_skipped_collective_is_reported_then_ended(tmp_path, n):
    """A rank that skips a collective: the stall report names it, then the watchdog ends the job."""
    script = tmp_path / 'skip.py'
    script.write_text(STALL_SCRIPT)
    res = run_mpi([script], n, timeout=120,
                  env={'CHAINERMN_STALL_SECONDS': '2', 'CHAINERMN_TIMEOUT': '10'})
    err = res.stderr
    assert not res.timed_out, err
    assert res.returncode == 14, err
    last = n - 1
    for r in range(n - 1):
        m = re.search(r'stall inspector: rank {} of {} \(host [^)]+\) has waited \d+ s in call #2 '
                      r'allreduce\(shape=\(1,\), dtype=<f8, op=sum\); still waiting[^\n]*\n\*\*\*   ranks that '
                      r'have not reached it: rank {} \(host [^)]+\): last entered collective call #1, now in '
                      r'call #2 recv\(\) \[source=0, tag=9\]'.format(r, n, last), err)
        assert m, err
    assert 'stall inspector: rank {} of {}'.format(last, n) in err, err
    assert 'chainermn watchdog: rank 0 of {}: call #2 allreduce'.format(n) in err, err
    # Reported once per call, and before the watchdog ended the job.
    assert err.count('stall inspector: rank 0 of') == 1, err
    assert err.index('stall inspector: rank 0') < err.index('chainermn watchdog:'), err
    assert res.seconds < LIMIT_S + 10, res.seconds
    _write_rows([('rank {} skips an allreduce (stall 2 s, timeout 10 s)'.format(last), 'collectives',
                  'n={} rank {}'.format(n, r),
                  'stall report, then watchdog: MPI_Abort(14)', res.seconds) for r in range(n)])


LATE_SCRIPT = '''
import os, sys, time, numpy, chainermn
report = sys.argv[1]
if int(os.environ.get('PMI_RANK', '0')) == 0:
    sys.stderr = open(report, 'w', buffering=1)   # rank 0's reports go to a file rank 1 can read
comm = chainermn.create_communicator('naive')
if comm.rank == 1:
    # Arrive only once rank 0's inspector has reported this rank missing.
    while 'stall inspector' not in (open(report).read() if os.path.exists(report) else ''):
        time.sleep(0.05)
sys.stdout.write('rank {} sum {}\\n'.format(comm.rank, comm.allreduce(numpy.ones(1))[0]))
'''


def test_late_rank_is_reported_and_the_job_goes_on(tmp_path):
    script = tmp_path / 'late.py'
    script.write_text(LATE_SCRIPT)
    report = tmp_path / 'rank0.err'
    res = run_mpi([script, report], 2, timeout=120,
                  env={'CHAINERMN_STALL_SECONDS': '1', 'CHAINERMN_TIMEOUT': '100'})
    assert not res.timed_out, res
    assert res.returncode == 0, res
    assert 'rank 0 sum 2.0' in res.stdout and 'rank 1 sum 2.0' in res.stdout, res
    text = report.read_text()
    assert re.search(r'rank 0 of 2 \(host [^)]+\) has waited \d+ s in call #1 allreduce[^\n]*still waiting[^\n]*\n'
                     r'\*\*\*   ranks that have not reached it: rank 1 \(host [^)]+\): last entered collective '
                     r'call #0, now not inside a chainermn call', text), text
    assert text.count('stall inspector') == 1, text


def test_stall_inspector_off(tmp_path):
    script = tmp_path / 'late.py'
    script.write_text('''
import sys, time, numpy, chainermn
comm = chainermn.create_communicator('naive')
assert comm._guard.config.stall_seconds == 0
if comm.rank == 1:
    time.sleep(3)   # longer than a 1 s threshold would allow; nothing may be reported
sys.stdout.write('rank {} sum {}\\n'.format(comm.rank, comm.allreduce(numpy.ones(1))[0]))
''')
    res = run_mpi([script], 2, timeout=120, env={'CHAINERMN_STALL_SECONDS': '0', 'CHAINERMN_TIMEOUT': '100'})
    assert res.returncode == 0, res
    assert 'rank 0 sum 2.0' in res.stdout, res
    assert 'stall inspector' not in res.stderr, res.stderr
