"""pytest helpers: run a pytest file on N ranks under mpiexec with a hard timeout."""

from chainermn_comm.mpirun import MpiResult, find_mpiexec, run_mpi

__all__ = ['MpiResult', 'find_mpiexec', 'run_mpi', 'run_pytest_under_mpi']


def run_pytest_under_mpi(path, n, timeout=300, extra_args=(), env=None, cwd=None):
    """Run the pytest file ``path`` on ``n`` ranks; assert every rank passed, with output on failure."""
    args = ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-p', 'chainermn_comm.testing.mpi_plugin',
            str(path)] + list(extra_args)
    res = run_mpi(args, n, timeout=timeout, env=env, cwd=cwd)
    report = ('mpiexec -n {} pytest {} -> status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'
              .format(n, path, res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
                      res.stdout[-20000:], res.stderr[-20000:]))
    assert not res.timed_out, report
    assert res.returncode == 0, report
    passed = res.stdout.count('CHAINERMN-RANK-PASSED')
    assert passed == n, report
    return res
