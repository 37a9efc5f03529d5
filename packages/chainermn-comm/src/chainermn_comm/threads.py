"""Size each rank's BLAS and OpenMP thread pools to its share of the machine's CPUs.

>>> from chainermn_comm import threads
>>> threads.current()       # after create_communicator: what this process chose
ThreadChoice(threads=1, source='rule', cpus=2, sharing=2)

Each BLAS (OpenBLAS, MKL) and OpenMP runtime starts one thread per core of the machine, so N ranks
on a node would run N x cores threads that spin against each other.  At communicator creation
(one ``allgather`` of a few numbers per rank) every rank applies, in this order:

1. ``CHAINERMN_THREADS=N``: N threads per pool (``0``: leave the pools alone);
2. ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS`` set by the user: the
   libraries already obey them; nothing is changed;
3. the rule: the CPUs this rank may run on (its affinity mask, capped by a cgroup CPU quota)
   divided by the ranks of the job on the same machine whose masks overlap its own (itself
   included), at least 1.

The pools are set with threadpoolctl (every BLAS and OpenMP library loaded so far; OpenBLAS's
setting holds for every thread of the process), and the three variables are exported with the
same number (``CHAINERMN_THREADS_CHOSEN`` marks them as chainermn's), so that libraries loaded later and child
processes (``MultiprocessIterator``'s workers, a forkserver) start with the same number instead
of one thread per core each (they stay in ``os.environ`` after ``finalize()``, for every child
started later).  The first communicator of a process decides, whatever it spans: one on
``COMM_SELF`` or a ``Split`` counts the job's ranks on the node that it does not hold from the
launcher's local size (:func:`launcher_local_size`); later ones (``split``) keep it.  A
threadpoolctl limit set earlier is replaced (nothing tells it from the libraries' start).
"The same machine" is the kernel's boot id, so nodes made of namespaces on one machine and
containers of one host count as the one machine whose CPUs they share.

Rank 0 logs once per job what the rule chose (``chainermn`` logger, jobs of more than one rank),
and warns once (one line for the job) when ranks are oversubscribed: more ranks on a machine than
its CPUs, or ranks bound to a set of CPUs smaller than their number.
"""

import collections
import functools
import os
import socket

from chainermn_comm import process, settings
from chainermn_comm.protocol import PROCESS_WIDE_ENV, THREADS_CHOSEN_ENV, THREADS_ENV

__all__ = ['POOL_VARIABLES', 'LOCAL_SIZE_VARIABLES', 'CpuFacts', 'ThreadChoice', 'local_facts',
           'launcher_local_size', 'spans', 'cpu_list', 'decide',
           'oversubscription', 'size_thread_pools', 'current', 'pools']

#: The variables through which a user sizes the pools (and which chainermn exports when unset).
POOL_VARIABLES = ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS')

#: What a rank tells the others: machine (boot id), host name, affinity mask (bits), CPUs online,
#: CPUs its cgroup quota allows (None: no quota), whether it already said the job's line, and,
#: when the communicator does not span the job: the job's ranks on its node by the launcher
#: (``node_ranks``, None: unknown) and its rank in ``MPI.COMM_WORLD`` (``world``).
CpuFacts = collections.namedtuple('CpuFacts', 'machine host mask online quota said node_ranks world',
                                  defaults=(None, None))

#: The launchers' variables for the number of the job's ranks on this node: Hydra (MPICH, Intel
#: MPI), Open MPI, MVAPICH2, Cray PALS.  Slurm's ``SLURM_STEP_TASKS_PER_NODE`` counts when every
#: node of the step runs the same number.
LOCAL_SIZE_VARIABLES = ('MPI_LOCALNRANKS', 'OMPI_COMM_WORLD_LOCAL_SIZE', 'MV2_COMM_WORLD_LOCAL_SIZE',
                        'PALS_LOCAL_SIZE')
_MAX_RANKS = 1 << 16

#: A rank's decision: ``threads`` per pool (None: left alone), ``source`` (``'rule'``, or the
#: variable that decided), the CPUs it may use and the ranks (itself included) that share them.
ThreadChoice = collections.namedtuple('ThreadChoice', 'threads source cpus sharing')

_state = {'choice': None, 'said': False}


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _machine():
    """Return an id of this machine shared by its namespaces and containers (boot id, else host)."""
    return _read('/proc/sys/kernel/random/boot_id') or socket.gethostname()


def _mask():
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # no affinity on this system: every CPU
        cpus = range(os.cpu_count() or 1)
    return sum(1 << c for c in cpus)


def _quota():
    """Return the whole CPUs the cgroup's CPU quota allows (v2 ``cpu.max``, v1 CFS), or None."""
    dirs = []
    for line in (_read('/proc/self/cgroup') or '').splitlines():
        parts = line.split(':', 2)
        if len(parts) == 3 and parts[1] == '':
            dirs += [('/sys/fs/cgroup' + parts[2]).rstrip('/'), '/sys/fs/cgroup']
        elif len(parts) == 3 and 'cpu' in parts[1].split(','):
            dirs += [os.path.join('/sys/fs/cgroup', c) + parts[2].rstrip('/') for c in (parts[1], 'cpu')]
    found = []
    for d in dirs:
        v2 = (_read(os.path.join(d, 'cpu.max')) or '').split()
        v1 = (_read(os.path.join(d, 'cpu.cfs_quota_us')), _read(os.path.join(d, 'cpu.cfs_period_us')))
        quota, period = (v2 + [None, None])[:2] if v2 else v1
        try:
            if quota not in (None, 'max', '-1') and int(period) > 0:
                found.append(max(1, int(quota) // int(period)))
        except (TypeError, ValueError):
            continue
    return min(found) if found else None


def local_facts(said=False, node_ranks=None, world=None):
    """Return this rank's :class:`CpuFacts`."""
    return CpuFacts(_machine(), socket.gethostname(), _mask(), os.cpu_count() or 1, _quota(), said,
                    node_ranks, world)


def launcher_local_size(environ=None):
    """Return the number of the job's ranks on this node that the launcher announces, or None."""
    env = os.environ if environ is None else environ
    values = [env.get(name, '') for name in LOCAL_SIZE_VARIABLES]
    slurm = env.get('SLURM_STEP_TASKS_PER_NODE', '').strip()
    if slurm and ',' not in slurm:      # '3' or '3(x2)': the same on every node
        values.append(slurm.split('(')[0])
    for value in values:
        value = value.strip()
        if value.isdigit() and 1 <= int(value) <= _MAX_RANKS:
            return int(value)
    return None


def spans(numbers):
    """Return sorted distinct ints as ``'0-3,8'`` (CPUs, ranks)."""
    numbers = sorted(set(numbers))
    out, i = [], 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        out.append(str(numbers[i]) if i == j else '{}-{}'.format(numbers[i], numbers[j]))
        i = j + 1
    return ','.join(out)


def cpu_list(mask):
    """Return the CPUs of a mask as ``'0-3,8'``."""
    return spans(c for c in range(mask.bit_length()) if mask >> c & 1)


def _usable(f, mask=None):
    """Return how many CPUs ``mask`` (default: the rank's) gives, capped by the rank's quota."""
    n = bin(f.mask if mask is None else mask).count('1')
    return n if f.quota is None else min(n, f.quota)


def _sharing(facts, rank):
    """Return the ranks on ``rank``'s machine whose masks overlap its own (itself included)."""
    me = facts[rank]
    return [r for r, f in enumerate(facts) if f.machine == me.machine and f.mask & me.mask]


def _unseen(facts, rank):
    """Return the job's ranks on ``rank``'s node that are not in the communicator (0: none or unknown).

    Their masks are unknown: they are counted as sharing the rank's CPUs.
    """
    me = facts[rank]
    if me.node_ranks is None:
        return 0
    return max(0, me.node_ranks - sum(1 for f in facts if f.machine == me.machine))


def _shared_by(facts, rank):
    return len(_sharing(facts, rank)) + _unseen(facts, rank)


def _user_variable(env):
    """Return the first pool variable the user set (not one chainermn exported), or None."""
    ours = env.get(THREADS_CHOSEN_ENV, '').strip()
    for name in POOL_VARIABLES:
        value = env.get(name, '').strip()
        if value and value != ours:
            return name
    return None


def decide(facts, rank, environ=None, alone=False):
    """Return the :class:`ThreadChoice` of ``rank`` given every rank's facts and its environment.

    ``alone``: the process is left alone (``chainermn_comm.process``): the rule sizes nothing.
    """
    env = os.environ if environ is None else environ
    cpus, sharing = _usable(facts[rank]), _shared_by(facts, rank)
    if settings.is_set(THREADS_ENV, environ=env):
        return ThreadChoice(settings.read(THREADS_ENV, environ=env) or None, THREADS_ENV, cpus, sharing)
    user = _user_variable(env)
    if user is not None:
        return ThreadChoice(None, user, cpus, sharing)
    if alone:
        return ThreadChoice(None, PROCESS_WIDE_ENV, cpus, sharing)
    return ThreadChoice(max(1, cpus // sharing), 'rule', cpus, sharing)


def oversubscription(facts):
    """Return one text per machine whose ranks outnumber the CPUs they may run on (empty: none)."""
    out = []
    for machine in dict.fromkeys(f.machine for f in facts):
        ranks = [r for r, f in enumerate(facts) if f.machine == machine]
        union = 0
        for r in ranks:
            union |= facts[r].mask
        cpus = _usable(facts[ranks[0]], union)
        unseen = max(_unseen(facts, r) for r in ranks)
        parts = []
        if len(ranks) + unseen > cpus:
            named = _ranges([_world(facts, r) for r in ranks])
            if unseen:
                named += ' and {} more of the job'.format(unseen)
            parts.append('{} ranks ({}) share {} CPU{}'.format(len(ranks) + unseen, named, cpus,
                                                              's' if cpus > 1 else ''))
        for r in ranks:
            group = _sharing(facts, r)
            mask = 0
            for g in group:
                mask |= facts[g].mask
            if r == group[0] and len(group) > _usable(facts[r], mask) and mask != union:
                parts.append('ranks {} are bound to the same CPU{} ({})'.format(
                    _ranges([_world(facts, g) for g in group]), 's' if bin(mask).count('1') > 1 else '',
                    cpu_list(mask)))
        if parts:
            hosts = '/'.join(dict.fromkeys(facts[r].host for r in ranks))
            out.append('{} on {}'.format(', '.join(parts), hosts))
    return out


def _ranges(ranks):
    return spans(ranks)


def _speaker(facts):
    """Return the index in ``facts`` of the job's rank 0 (the communicator's rank 0 if they do not say)."""
    return next((r for r, f in enumerate(facts) if f.world == 0), 0)


def _world(facts, rank):
    """Return ``rank``'s rank in ``MPI.COMM_WORLD`` (its own where the facts do not say)."""
    world = facts[rank].world
    return rank if world is None else world


def _apply(threads):
    """Set every loaded BLAS and OpenMP pool to ``threads``; export it for what starts later."""
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=threads)
    except Exception as e:  # never fail one rank in the middle of a collective creation
        from chainermn_comm.log import get_logger
        get_logger('threads').warning('could not size the thread pools with threadpoolctl (%s: %s); '
                                      'libraries loaded from now on use %d', type(e).__name__, e, threads)
    for name in POOL_VARIABLES + (THREADS_CHOSEN_ENV,):
        os.environ[name] = str(threads)


def pools():
    """Return ``[(library, threading layer, threads)]`` of the BLAS and OpenMP pools loaded now."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [(p.get('internal_api'), p.get('threading_layer'), p.get('num_threads'))
            for p in threadpool_info()]


def current():
    """Return the :class:`ThreadChoice` this process made (None before its first communicator)."""
    return _state['choice']


def size_thread_pools(mpi_comm):
    """Size this rank's pools (the first time in a process); say once per job what was chosen.

    Collective over ``mpi_comm``: one ``allgather`` of each rank's :class:`CpuFacts`.  When
    ``mpi_comm`` spans less than the job (``COMM_SELF``, a ``Split``), the job's ranks on the node
    that it does not hold are counted from the launcher (:func:`launcher_local_size`), and only
    the job's rank 0 says the line.
    """
    whole, world_rank, world_size = _world_of(mpi_comm)
    node_ranks = None if whole else launcher_local_size()
    facts = mpi_comm.allgather(local_facts(_state['said'], node_ranks, None if whole else world_rank))
    rank = mpi_comm.Get_rank()
    if _state['choice'] is None:
        choice = decide(facts, rank, alone=process.left_alone())
        if choice.threads:   # CHAINERMN_THREADS=N is asked for by name: done even when left alone
            process.install('thread pools', functools.partial(_apply, choice.threads),
                            asked=choice.source == THREADS_ENV)
        _state['choice'] = choice
    said, _state['said'] = any(f.said for f in facts), True
    if (rank if whole else world_rank) == 0 and not said:
        _say(facts, world_size)
    return _state['choice']


def _world_of(mpi_comm):
    """Return (whether ``mpi_comm`` spans ``MPI.COMM_WORLD``, the world rank, the world size)."""
    try:
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        return mpi_comm.Get_size() == world.Get_size(), world.Get_rank(), world.Get_size()
    except Exception:   # not mpi4py's: the communicator is the job
        return True, mpi_comm.Get_rank(), mpi_comm.Get_size()


def _say(facts, size):
    from chainermn_comm.log import get_logger
    logger = get_logger('threads')
    choice = _state['choice']
    if choice.source == 'rule' and size > 1:
        counts = sorted({max(1, _usable(f) // _shared_by(facts, r)) for r, f in enumerate(facts)})
        n = str(counts[0]) if len(counts) == 1 else '{}-{}'.format(counts[0], counts[-1])
        logger.info('BLAS and OpenMP threads: %s per rank (rank 0: CPUs %s, %d usable, shared by %d '
                    'ranks); %s=N sets N, 0 leaves the pools alone', n,
                    cpu_list(facts[_speaker(facts)].mask), choice.cpus, choice.sharing, THREADS_ENV)
    problems = oversubscription(facts)
    if problems:
        logger.warning('oversubscribed: %s; the ranks spin against each other: start at most as many '
                       'ranks per node as it has CPUs, bound to disjoint cores (docs/communicators.md, '
                       '"Ranks, cores and threads")', '; '.join(problems))
