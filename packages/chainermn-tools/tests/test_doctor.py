"""``python -m chainermn doctor``: healthy runs at 1 and 2 ranks, and the rank-0-everywhere mismatch."""

import os
import re
import socket
import subprocess
import sys

import pytest

from chainermn_comm.testing import run_mpi

BIN = os.path.dirname(sys.executable)
ROWS = ['mpi4py / MPI library', 'mpiexec', 'launch', 'ranks / hosts', 'cores / ranks', 'rank affinity',
        'thread pools', 'intra / inter layout',
        'collective round trip', 'link within a node', 'link between nodes', 'packages', 'import chainermn', 'cupy', 'nccl', 'gpus',
        'cuda-aware MPI', 'MV2_USE_CUDA', 'MV2_SMP_USE_CMA', 'LD_LIBRARY_PATH']


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('PMI_', 'PMIX_', 'OMPI_', 'MPI_LOCAL', 'HYDRA_', 'MV2_COMM'))}
    env['PATH'] = BIN + os.pathsep + env.get('PATH', '')
    env.update(extra)
    return env


def _row(out, name):
    line = next((ln for ln in out.splitlines() if ln.startswith(name + '  ')), None)
    assert line is not None, 'row {!r} missing in:\n{}'.format(name, out)
    return line


def _flat(out):
    """The report with wrapped cells joined: phrases can be searched across line breaks."""
    return ' '.join(out.replace('\n' + ' ' * 33, ' ').split())


LINK = re.compile(r'latency ([0-9.]+) us, bandwidth ([0-9.]+) GB/s')


def _links(flat, name):
    """Return [(latency_us, GB/s)] measured in row ``name`` of the flattened report."""
    row = flat.split(name, 1)[1].split('(MPI_Allreduce', 1)[0]
    return [(float(a), float(b)) for a, b in LINK.findall(row)]


def _assert_table(out):
    assert out.count('CHECK ') == 1, out  # printed once (rank 0 only)
    for name in ROWS:
        _row(out, name)


def test_healthy_single_process():
    res = subprocess.run([sys.executable, '-m', 'chainermn_tools', 'doctor'], capture_output=True,
                         text=True, timeout=300, env=_env())
    assert res.returncode == 0, res.stdout + res.stderr
    _assert_table(res.stdout)
    flat = _flat(res.stdout)
    assert ' OK ' in _row(res.stdout, 'launch') and 'COMM_WORLD size 1' in flat
    assert 'MPICH' in _row(res.stdout, 'mpi4py / MPI library')
    assert 'OK' in _row(res.stdout, 'mpiexec') and 'matches MPICH' in flat
    assert '1 rank(s) on 1 host(s)' in flat
    assert 'OK' in _row(res.stdout, 'collective round trip')
    for name in ('link within a node', 'link between nodes'):
        assert 'SKIP' in _row(res.stdout, name), res.stdout
    assert flat.count('one rank: run under `mpiexec -n 2` (or more) to measure') == 2, flat
    assert 'failed' in res.stdout and '-> OK' in res.stdout.splitlines()[-1]


@pytest.mark.parametrize('n', [2, 3])
def test_healthy_ranks_on_one_host_measure_the_link_within_it(n):
    # CHAINERMN_RANKS_PER_NODE splits the ranks into simulated nodes for the communicator; the
    # links are measured by host name, so all ranks still share one host.
    res = run_mpi(['-m', 'chainermn_tools', 'doctor', '--no-cuda-aware-check'], n, timeout=300,
                  env=_env(CHAINERMN_RANKS_PER_NODE='1'))
    assert not res.timed_out and res.returncode == 0, res.stdout + res.stderr
    _assert_table(res.stdout)
    flat = _flat(res.stdout)
    host = socket.gethostname()
    assert 'COMM_WORLD size {0} matches the launch (PMI_SIZE={0})'.format(n) in flat
    assert '{} rank(s) on 1 host(s)'.format(n) in flat
    layout = _row(res.stdout, 'intra / inter layout')
    assert ' OK ' in layout and 'inter_size={}'.format(n) in layout, res.stdout
    assert 'across {} rank(s) gave the expected values'.format(n) in flat
    assert 'CHAINERMN_RANKS_PER_NODE=1' in _row(res.stdout, 'CHAINERMN_* env')
    within = _row(res.stdout, 'link within a node')
    assert ' INFO ' in within and '{} (ranks 0-{})'.format(host, n - 1) in flat, res.stdout
    ((latency, gbps),) = _links(flat, 'link within a node')
    assert 0 < latency < 1e5 and 0.01 < gbps < 1e4, (latency, gbps)
    assert 'SKIP' in _row(res.stdout, 'link between nodes')
    assert 'not measurable: all {} ranks run on one host ({})'.format(n, host) in flat, flat
    # The node: its CPUs, every rank's affinity and pools; oversubscribed only with more ranks than CPUs.
    cpus = sorted(os.sched_getaffinity(0))
    over = n > len(cpus)
    assert (' WARN ' in _row(res.stdout, 'cores / ranks')) == over, res.stdout
    assert '{}: {} CPU'.format(host, len(cpus)) in flat and '{} ranks (0-{})'.format(n, n - 1) in flat
    assert ('oversubscribed: {} ranks (0-{}) share'.format(n, n - 1) in flat) == over, flat
    assert 'ranks 0-{}: CPUs {}'.format(n - 1, '-'.join(map(str, (cpus[0], cpus[-1]))) if len(cpus) > 1
                                        else cpus[0]) in flat, flat
    threads = max(1, len(cpus) // n)
    assert 'openblas {} thread'.format(threads) in _row(res.stdout, 'thread pools'), res.stdout
    assert 'set by chainermn: {} CPUs for {} ranks'.format(len(cpus), n) in flat, flat


def test_ranks_bound_to_one_cpu_are_reported_and_the_user_setting_shown():
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})  # a node of one CPU: mpiexec and its ranks run on it
    try:
        res = run_mpi(['-m', 'chainermn_tools', 'doctor', '--no-cuda-aware-check', '--no-links'], 2,
                      timeout=300, env=_env(CHAINERMN_THREADS='1'))
    finally:
        os.sched_setaffinity(0, before)
    assert not res.timed_out and res.returncode == 0, res.stdout + res.stderr
    flat = _flat(res.stdout)
    assert ' WARN ' in _row(res.stdout, 'cores / ranks') and 'oversubscribed: 2 ranks (0-1) share 1 CPU' in flat
    assert 'ranks 0-1: CPUs {}'.format(min(before)) in flat and 'set by CHAINERMN_THREADS=1' in flat, flat
    assert '-bind-to core' in flat and 'srun --cpu-bind=cores' in flat, flat  # what to do
    # The same warning once for the job, at communicator creation (rank 0).
    assert res.stderr.count('oversubscribed: 2 ranks (0-1) share 1 CPU') == 1, res.stderr


def test_cpu_rows_units():
    from chainermn_comm.threads import CpuFacts
    from chainermn_tools.doctor import _cpus
    from chainermn_tools.doctor._report import OK, WARN

    def rank(machine, host, mask, pools=(('openblas', 'pthreads', 1),), choice=(1, 'rule', 1, 1)):
        return {'facts': CpuFacts(machine, host, mask, 4, None, False), 'pools': list(pools), 'choice': choice}
    bound = [rank('m', 'a', 0b0001), rank('m', 'a', 0b0010), rank('n', 'b', 0b0011, choice=(None, 'OMP_NUM_THREADS', 2, 1))]
    cores, affinity, pools = _cpus.cpu_rows(bound)
    assert cores.status == OK and cores.detail == 'a: 2 CPUs (0-1), 2 ranks (0-1); b: 2 CPUs (0-1), 1 rank (2)'
    assert affinity.detail == 'rank 0: CPUs 0; rank 1: CPUs 1; rank 2: CPUs 0-1'
    assert pools.detail == ('ranks 0-1: openblas 1 thread (pthreads); set by chainermn: 1 CPU for 1 rank; '
                            'rank 2: openblas 1 thread (pthreads); left as OMP_NUM_THREADS sets them')
    same = [rank('m', 'a', 0b0001), rank('m', 'a', 0b0001), rank('m', 'a', 0b0110)]
    cores = _cpus.cpu_rows(same)[0]
    assert cores.status == WARN and 'ranks 0-1 are bound to the same CPU (0) on a' in cores.detail, cores


def test_no_links_skips_the_measurement():
    res = run_mpi(['-m', 'chainermn_tools', 'doctor', '--no-cuda-aware-check', '--no-links'], 2,
                  timeout=300, env=_env())
    assert not res.timed_out and res.returncode == 0, res.stdout + res.stderr
    for name in ('link within a node', 'link between nodes'):
        assert 'SKIP' in _row(res.stdout, name) and 'skipped (--no-links)' in _row(res.stdout, name)


def test_link_rows_units():
    from chainermn_tools.doctor import _links
    from chainermn_tools.doctor._report import FAIL, INFO, SKIP

    def result(us, gbps, ok=True):
        return {'ranks': 2, 'latency_us': us, 'gbps': gbps, 'ok': ok}

    hosts = {'a': [0, 1], 'b': [2, 3]}
    found = {'hosts': hosts, 'within': {'a': result(3.0, 9.5), 'b': result(4.0, 8.25)},
             'between': result(50.0, 1.125)}
    within, between = _links.rows_for(found, 4)
    assert within.status == INFO and between.status == INFO
    assert within.detail.startswith('b (ranks 2-3): latency 4.0 us, bandwidth 8.25 GB/s; '
                                    'a (ranks 0-1): latency 3.0 us, bandwidth 9.50 GB/s'), within
    assert between.detail.startswith('2 nodes, one rank each (ranks 0,2): latency 50.0 us, '
                                     'bandwidth 1.12 GB/s'), between
    many = {'hosts': {h: [2 * i, 2 * i + 1] for i, h in enumerate('abcde')},
            'within': {h: result(1.0, float(i + 1)) for i, h in enumerate('abcde')}, 'between': None}
    within, between = _links.rows_for(many, 10)
    assert within.detail.startswith('slowest and fastest of 5 nodes: a (ranks 0-1)'), within
    assert 'e (ranks 8-9)' in within.detail and 'c (ranks' not in within.detail, within
    one = {'hosts': {'a': [0, 1, 2]}, 'within': {'a': result(2.0, 3.0)}, 'between': None}
    between = _links.rows_for(one, 3)[1]
    assert between.status == SKIP and 'all 3 ranks run on one host (a)' in between.detail
    lonely = {'hosts': {'a': [0], 'b': [1]}, 'within': {}, 'between': result(9.0, 2.0, ok=False)}
    within, between = _links.rows_for(lonely, 2)
    assert within.status == SKIP and 'every host runs one rank (a, b)' in within.detail
    assert between.status == FAIL and 'wrong values' in between.fix


@pytest.mark.parametrize('size_var,rank_var,launcher', [
    ('PMI_SIZE', 'PMI_RANK', 'Hydra/PMI'),
    ('OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_RANK', 'Open MPI'),
])
def test_every_process_rank_0_is_detected(size_var, rank_var, launcher):
    """Two separate singletons that a launcher told 'you are 1 of 2' -- the classic mismatch."""
    procs = [subprocess.Popen([sys.executable, '-m', 'chainermn_tools', 'doctor'],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(**{size_var: '2', rank_var: str(r)})) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 1, out + err
        launch = _row(out, 'launch')
        flat = _flat(out)
        assert 'FAIL' in launch and 'every process is rank 0' in flat, out
        assert '{}=2'.format(size_var) in flat
        assert launcher in flat, out
        if launcher == 'Open MPI':
            assert 'mpi4py is linked against MPICH' in flat, out
        assert 'What to do:' in out and '-> BROKEN' in out.splitlines()[-1]


def test_launch_diagnosis_units():
    from chainermn_tools.doctor import _launch
    assert _launch.diagnose(1, 0, env={})[0] is True
    assert _launch.diagnose(1, 0, env={'PMI_SIZE': '1', 'PMI_RANK': '0'})[0] is True
    ok, evidence, msg = _launch.diagnose(1, 0, env={'OMPI_COMM_WORLD_SIZE': '4'})
    assert not ok and evidence == 'OMPI_COMM_WORLD_SIZE=4' and 'rank 0' in msg
    assert _launch.diagnose(1, 0, env={'PMIX_RANK': '3'})[1] == 'PMIX_RANK=3'
    assert _launch.diagnose(1, 0, env={}, siblings=('hydra_pmi_proxy', 3))[0] is False
    assert _launch.diagnose(4, 2, env={'PMI_SIZE': '4', 'PMI_RANK': '2'})[0] is True
    assert _launch.diagnose(4, 2, env={'PMI_SIZE': '8'})[1] == 'PMI_SIZE'
    assert 'Open MPI' in _launch.explain('OMPI_COMM_WORLD_SIZE=2', 'mpich', 'MPICH', None)
    assert 'srun --mpi=pmix' in _launch.explain('SLURM_STEP_NUM_TASKS=2', 'mpich', 'MPICH', None)


def test_vendor_matching_units():
    from chainermn_tools.doctor import _mpi
    from chainermn_tools.doctor._report import FAIL, OK, WARN
    ompi = _mpi.library_family('Open MPI v4.1.5, package: Open MPI ...')
    mvapich = _mpi.library_family('MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date')
    assert ompi == ('openmpi', 'Open MPI') and mvapich == ('mpich', 'MVAPICH')
    assert _mpi.launcher_family('mpiexec (OpenRTE) 4.1.5\n')[0] == 'openmpi'
    assert _mpi.launcher_family('HYDRA build details:\n    Version: 3.1.4\n')[0] == 'mpich'
    lib = {'family': 'openmpi', 'vendor': 'Open MPI', 'version': '4.1.5'}
    hydra = {'path': '/usr/bin/mpiexec', 'family': 'mpich', 'description': 'Hydra', 'version': '3.1.4'}
    status, detail, fix = _mpi.compare(lib, hydra)
    assert status == FAIL and 'does NOT match' in detail and 'mpi4py' in fix
    assert _mpi.compare(dict(lib, family='mpich', vendor='MPICH', version='3.1.4'), hydra)[0] == OK
    assert _mpi.compare(lib, None)[0] == WARN


def test_mvapich_without_mv2_use_cuda_fails():
    from chainermn_tools.doctor import _checks
    from chainermn_tools.doctor._report import FAIL
    facts = [{'rank': 0, 'env': {'MV2_USE_CUDA': None, 'MV2_SMP_USE_CMA': None,
                                 'LD_LIBRARY_PATH': '/x', 'CHAINERMN_DEBUG': None},
              'mpiexec': '/usr/bin/mpiexec'}]
    rows = _checks._env_rows(facts, {'vendor': 'MVAPICH'}, has_gpu=True)
    row = next(r for r in rows if r.check == 'MV2_USE_CUDA')
    assert row.status == FAIL and 'MV2_USE_CUDA=1' in row.fix


def test_doctor_without_an_mpi_library_says_how_to_get_one(tmp_path):
    """The doctor's mpi4py row gives the same fix as chainermn_comm's error."""
    from chainermn_comm.install_hints import MPI_INSTALL_HINT
    env = dict(os.environ, MPI4PY_LIBMPI=str(tmp_path / 'no-such-libmpi.so'))
    res = subprocess.run([sys.executable, '-m', 'chainermn_tools', 'doctor'], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert 'mpi4py' in res.stdout and 'FAIL' in res.stdout, res.stdout
    assert ' '.join(MPI_INSTALL_HINT.split()) in ' '.join(res.stdout.replace('\n      ', ' ').split()), res.stdout


def test_doctor_gpu_advice_is_the_comm_hint():
    from chainermn_comm.install_hints import GPU_INSTALL_HINT
    from chainermn_tools.doctor import _checks
    facts = [{'host': 'h', 'gpu': {'cupy': None, 'cupy_error': 'CuPy is not importable', 'devices': 0,
                                   'cuda': None, 'nccl': None, 'nccl_error': None}}]
    rows = _checks._gpu_rows(facts, None, None, None)
    assert [r.check for r in rows[:2]] == ['cupy', 'nccl'], rows
    assert GPU_INSTALL_HINT in rows[0].fix and GPU_INSTALL_HINT in rows[1].fix, rows
