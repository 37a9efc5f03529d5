"""The doctor's checks: every rank runs run_all(); rank 0 assembles the rows."""

import importlib
import os
import time

import numpy
from chainermn_comm.install_hints import GPU_INSTALL_HINT

from chainermn_tools.doctor import _cpus, _facts, _gpu, _launch, _links, _mpi, _slurm
from chainermn_tools.doctor._report import FAIL, INFO, OK, SKIP, WARN, Row
from chainermn_tools.doctor._report import ranges as _ranges

__all__ = ['run_all']


def _by_host(facts):
    hosts = {}
    for f in facts:
        hosts.setdefault(f['host'], []).append(f['rank'])
    return hosts


def _package_rows(facts):
    rows = []
    mine = facts[0]['packages']
    broken = {k: v for k, v in mine.items() if v.startswith('ERROR')}
    differ = [k for k in mine if any(f['packages'].get(k) != mine[k] for f in facts)]
    detail = ', '.join('{} {}'.format(k, v) for k, v in mine.items() if k not in broken)
    if broken:
        rows.append(Row('packages', FAIL, '; '.join('{} {}'.format(k, v) for k, v in broken.items()),
                        'install every sub-package: `pip install packages/chainermn` from the '
                        'repository root (it installs the four sub-packages from the checkout too; '
                        'see packages/chainermn/README.md)'))
    elif differ:
        rows.append(Row('packages', FAIL, 'versions differ between ranks: {}'.format(', '.join(differ)),
                        'install the same versions on every host'))
    else:
        rows.append(Row('packages', OK, detail))
    rows.extend(_meta_rows(_facts.meta_package()))
    pythons = sorted({(f['python'], f['python_version']) for f in facts})
    if len({v for _, v in pythons}) > 1:
        rows.append(Row('python', FAIL, 'ranks run different Python versions: {}'.format(pythons),
                        'use the same Python (same path and version) on every host'))
    elif len(pythons) > 1:
        rows.append(Row('python', WARN, 'ranks run different interpreters: {}'.format(
            ', '.join(p for p, _ in pythons)), 'use the same Python path on every host'))
    else:
        rows.append(Row('python', OK, '{} {}'.format(pythons[0][1], pythons[0][0])))
    return rows


def _meta_rows(chainermn):
    """Say whether ``import chainermn`` is the meta-package (not Chainer's copy) and the compat hook."""
    if chainermn is None:
        return [Row('import chainermn', INFO, 'the meta-package is not installed (the chainermn_* '
                    'packages work on their own; `pip install chainermn` adds it)')]
    ours = os.path.isfile(os.path.join(os.path.dirname(chainermn.__file__), '_meta_marker.py'))
    return [Row('import chainermn', OK if ours else FAIL, chainermn.__file__ if ours else
                '{} is not this chainermn (probably the copy bundled with Chainer)'.format(
                    chainermn.__file__),
                'reinstall the meta-package: `pip install --force-reinstall --no-deps '
                'packages/chainermn`'),
            _compat_row()]


def _compat_row():
    """Say whether the Chainer compat hook (NumPy 2, Python 3.12, setuptools 81) is active and why."""
    try:
        # The meta-package's compat hook; looked at, never depended on.
        compat = importlib.import_module('_chainermn_compat')
    except ImportError as e:
        return Row('chainer compat', WARN, 'cannot import _chainermn_compat: {}'.format(e),
                   'reinstall the meta-package: `pip install --force-reinstall --no-deps '
                   'packages/chainermn`')
    active, reasons = compat.status()
    if not active:
        return Row('chainer compat', OK, 'inactive: ' + '; '.join(reasons))
    if compat.installed() is None:
        return Row('chainer compat', FAIL, 'needed ({}) but not installed'.format('; '.join(reasons)),
                   'install chainermn with pip so that site-packages holds chainermn_precedence.pth '
                   '(a PYTHONPATH checkout runs no .pth file), or call _chainermn_compat.install() '
                   'before `import chainer`')
    applied = compat.applied()
    return Row('chainer compat', OK, 'active: {}{}'.format(
        '; '.join(reasons), '; applied: ' + ', '.join(applied) if applied else ''))


def _gpu_rows(facts, lib, cuda_aware, mpiexec):
    rows = []
    g0 = facts[0]['gpu']
    if g0['cupy'] is None:
        rows.append(Row('cupy', WARN, 'not available: {}'.format(g0['cupy_error']),
                        'CPU-only is fine for the naive communicator; for GPUs ' + GPU_INSTALL_HINT))
    else:
        cuda = g0['cuda']
        rows.append(Row('cupy', OK, 'CuPy {}{}'.format(
            g0['cupy'], ', CUDA runtime {}.{}'.format(cuda // 1000, cuda % 1000 // 10) if cuda else '')))
    if g0['nccl'] is not None:
        rows.append(Row('nccl', OK, 'NCCL {} (cupy.cuda.nccl)'.format(g0['nccl'])))
    else:
        rows.append(Row('nccl', WARN, 'not available: {}'.format(g0['nccl_error'] or g0['cupy_error']),
                        'GPU communicators other than naive/flat need NCCL 2: ' + GPU_INSTALL_HINT
                        + '; check with `python -c "from cupy.cuda import nccl"`'))
    per_host = {}
    for f in facts:
        per_host.setdefault(f['host'], [0, 0])
        per_host[f['host']][0] = max(per_host[f['host']][0], f['gpu']['devices'])
        per_host[f['host']][1] += 1
    text = ', '.join('{}: {} GPU(s) for {} rank(s)'.format(h, g, n) for h, (g, n) in per_host.items())
    if all(g == 0 for g, _ in per_host.values()):
        rows.append(Row('gpus', WARN, 'no CUDA GPU visible ({})'.format(text),
                        'fine for CPU runs (`--communicator naive`); for GPU runs check the driver, '
                        'CUDA_VISIBLE_DEVICES and CuPy'))
    elif any(n > g for g, n in per_host.values()):
        rows.append(Row('gpus', WARN, text + '; some ranks must share a GPU',
                        'start at most one rank per GPU on each host (NCCL refuses two ranks on '
                        'one GPU): lower -n or the ranks per host in your hostfile'))
    else:
        rows.append(Row('gpus', OK, text))
    if g0['cupy'] is None or g0['devices'] == 0:
        rows.append(Row('cuda-aware MPI', SKIP, 'needs CuPy and a GPU'))
    elif not cuda_aware:
        rows.append(Row('cuda-aware MPI', SKIP, 'skipped (--no-cuda-aware-check)'))
    else:
        ok, detail = _gpu.cuda_aware_check(mpiexec)
        rows.append(Row('cuda-aware MPI', OK if ok else WARN, detail,
                        'your MPI cannot use device buffers: the naive and pure_nccl communicators '
                        'still work (and non_cuda_aware stages through the host); for the others '
                        'rebuild MPI with CUDA (Open MPI `./configure --with-cuda`, MVAPICH '
                        '`--enable-cuda` and `export MV2_USE_CUDA=1`)'))
    return rows


def _env_rows(facts, lib, has_gpu):
    rows = []
    mvapich = lib['vendor'] == 'MVAPICH'
    for name in ('MV2_USE_CUDA', 'MV2_SMP_USE_CMA'):
        values = sorted({str(f['env'][name]) for f in facts})
        shown = ' / '.join('unset' if v == 'None' else v for v in values)
        if len(values) > 1:
            rows.append(Row(name, WARN, 'differs between ranks: {}'.format(shown),
                            'export the same value on every host (non-interactive ssh shells may '
                            'read other start-up files than your login shell)'))
        elif name == 'MV2_USE_CUDA' and mvapich and has_gpu and values != ['1']:
            rows.append(Row(name, FAIL, '{} with MVAPICH and GPUs'.format(shown),
                            '`export MV2_USE_CUDA=1` on every host; without it MVAPICH crashes with '
                            'a segmentation fault on GPU buffers'))
        elif name == 'MV2_SMP_USE_CMA' and mvapich and values == ['None']:
            rows.append(Row(name, INFO, 'unset; if MPI_Init fails with "CMA is not available", '
                            'export MV2_SMP_USE_CMA=0'))
        else:
            rows.append(Row(name, INFO, shown + ('' if mvapich else ' (only MVAPICH reads it)')))
    paths = {}
    for f in facts:
        paths.setdefault(f['env']['LD_LIBRARY_PATH'] or '', []).append(f['rank'])
    if len(paths) > 1:
        rows.append(Row('LD_LIBRARY_PATH', WARN, '; '.join('ranks {}: {!r}'.format(_ranges(r), p)
                                                          for p, r in paths.items()),
                        'make LD_LIBRARY_PATH the same on every host (check `ssh host env`)'))
    else:
        rows.append(Row('LD_LIBRARY_PATH', INFO, next(iter(paths)) or 'unset'))
    launchers = {}
    for f in facts:
        launchers.setdefault(f['mpiexec'] or 'none', []).append(f['rank'])
    if len(launchers) > 1:
        rows.append(Row('mpiexec on PATH', WARN, '; '.join('ranks {}: {}'.format(_ranges(r), p)
                                                          for p, r in launchers.items()),
                        'every host must use the same mpiexec binary: fix PATH on the hosts'))
    chainermn_env = ['{}={}'.format(k, v) for k, v in facts[0]['env'].items()
                     if k.startswith('CHAINERMN_') and v is not None]
    rows.append(Row('CHAINERMN_* env', INFO, ', '.join(chainermn_env) or 'none set'))
    return rows


def _collective(comm, MPI):
    """Return (ok, detail) after allreduce / allreduce_obj / bcast_obj with value checks."""
    n, r = comm.size, comm.rank
    start = time.monotonic()
    x = numpy.arange(6, dtype=numpy.float32) * (r + 1)
    y = comm.allreduce(x)
    want = numpy.arange(6, dtype=numpy.float32) * (n * (n + 1) // 2)
    total = comm.allreduce_obj(r)
    raw = comm.mpi_comm.allreduce(r, op=MPI.SUM)
    token = comm.bcast_obj(('doctor', n) if r == 0 else None)
    ms = (time.monotonic() - start) * 1e3
    problems = []
    if not numpy.allclose(y, want):
        problems.append('allreduce gave {} instead of {}'.format(y.tolist(), want.tolist()))
    if total != n * (n - 1) // 2 or raw != total:
        problems.append('sum of ranks gave {}/{} instead of {}'.format(total, raw, n * (n - 1) // 2))
    if token != ('doctor', n):
        problems.append('bcast_obj gave {!r}'.format(token))
    if problems:
        return False, '; '.join(problems)
    return True, 'allreduce, allreduce_obj and bcast_obj across {} rank(s) gave the expected ' \
        'values ({:.1f} ms)'.format(n, ms)


def _link_rows(world, MPI, facts, measure):
    """Return the link rows (on rank 0; None elsewhere). Collective when ``measure`` and size > 1."""
    size = world.Get_size()
    if not measure:
        skipped = 'skipped (--no-links)'
        return [Row(_links.WITHIN, SKIP, skipped), Row(_links.BETWEEN, SKIP, skipped)]
    found = _links.measure(world, MPI, [f['host'] for f in facts]) if size > 1 else {'hosts': {}}
    return _links.rows_for(found, size) if world.Get_rank() == 0 else None


def run_all(MPI, timeout=60.0, cuda_aware=True, links=True):
    """Run every check; return (rows, is_printer). Collective: call on every rank."""
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    lib = _mpi.library_info(MPI)
    on_path, beside = _mpi.find_mpiexec()
    rows = [Row('mpi4py / MPI library', OK if lib['family'] != 'unknown' else WARN,
                'mpi4py {} linked against {} {} (MPI standard {})'.format(
                    lib['mpi4py'], lib['vendor'], lib['version'] or '?', lib['standard']),
                'could not recognise the MPI vendor; check MPI.Get_library_version()')]
    launcher = _mpi.mpiexec_info(on_path or beside) if (on_path or beside) and rank == 0 else None
    if rank == 0:
        status, detail, fix = _mpi.compare(lib, launcher)
        if on_path is None and beside:
            detail = 'not on PATH; next to this Python: ' + detail
            if status == OK:
                status = WARN
                fix = 'add {} to PATH (or call mpiexec by its full path)'.format(
                    os.path.dirname(beside))
        rows.append(Row('mpiexec', status, detail, fix))
    siblings = _launch.sibling_singletons() if size == 1 else None
    launch_ok, evidence, launch_msg = _launch.diagnose(size, rank, siblings=siblings)
    launch_fix = '' if launch_ok else _launch.explain(evidence, lib['family'], lib['vendor'],
                                                      beside or on_path)
    try:
        from chainermn_comm import create_communicator
        comm = create_communicator('naive', mpi_comm=world, timeout=timeout)
    except Exception as e:
        rows.append(Row('communicator', FAIL, 'create_communicator("naive") failed: {}: {}'.format(
            type(e).__name__, e), 'see the error; run the mpi4py check from the manual'))
        return rows, True
    facts = comm.allgather_obj(_facts.local_facts(rank, on_path))
    launches = comm.allgather_obj((launch_ok, launch_msg, launch_fix))
    bad = [(i, m, f) for i, (ok, m, f) in enumerate(launches) if not ok]
    if bad:
        rows.append(Row('launch', FAIL, 'rank {}: {}'.format(bad[0][0], bad[0][1]) if size > 1
                        else bad[0][1], bad[0][2]))
    else:
        rows.append(Row('launch', OK, launch_msg))
    hosts = _by_host(facts)
    rows.append(Row('ranks / hosts', INFO, '{} rank(s) on {} host(s): {}'.format(
        size, len(hosts), ', '.join('{} [{}]'.format(h, _ranges(r)) for h, r in hosts.items()))))
    if rank == 0:
        rows += _slurm.slurm_rows(lib, size, hosts)
        rows += _cpus.cpu_rows([f['cpus'] for f in facts])
    layout = comm.allgather_obj((comm.intra_rank, comm.intra_size, comm.inter_rank, comm.inter_size))
    simulated = os.environ.get('CHAINERMN_RANKS_PER_NODE')
    nodes = {}
    for r, (ir, isz, nr, nsz) in enumerate(layout):
        nodes.setdefault(nr, []).append(r)
    consistent = all(l[3] == len(nodes) for l in layout) and all(
        layout[r][1] == len(rs) and [layout[x][0] for x in rs] == list(range(len(rs)))
        for rs in nodes.values() for r in rs)
    rows.append(Row('intra / inter layout', OK if consistent else FAIL,
                    'inter_size={} node(s){}: {}'.format(
                        len(nodes), ' (simulated: CHAINERMN_RANKS_PER_NODE={})'.format(simulated)
                        if simulated else '', '; '.join('node {}: ranks {} (intra_size {})'.format(
                            n, _ranges(rs), len(rs)) for n, rs in sorted(nodes.items()))),
                    'intra/inter ranks disagree between ranks: check host names '
                    '(MPI_Get_processor_name) and CHAINERMN_RANKS_PER_NODE'))
    try:
        ok, detail = _collective(comm, MPI)
    except Exception as e:
        ok, detail = False, '{}: {}'.format(type(e).__name__, e)
    oks = comm.allgather_obj(ok)
    rows.append(Row('collective round trip', OK if all(oks) else FAIL,
                    detail if ok or rank == 0 else 'failed on ranks {}'.format(
                        _ranges(i for i, v in enumerate(oks) if not v)),
                    'collectives give wrong values: check that all hosts use the same MPI and '
                    'network settings (try the manual\'s check_mpi4py.py)'))
    if all(oks):
        rows += _link_rows(world, MPI, facts, links) or []
    elif rank == 0:
        rows += [Row(n, SKIP, 'not measured: the collective round trip failed')
                 for n in (_links.WITHIN, _links.BETWEEN)]
    if rank == 0:
        rows += _package_rows(facts)
        has_gpu = any(f['gpu']['devices'] for f in facts)
        rows += _gpu_rows(facts, lib, cuda_aware, beside or on_path)
        rows += _env_rows(facts, lib, has_gpu)
    rows = comm.bcast_obj(rows)
    return rows, rank == 0
