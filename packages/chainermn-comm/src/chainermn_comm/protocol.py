"""Contracts between chainermn's packages and processes, in one place.

- every ``CHAINERMN_*`` environment variable: its name, kind, default and meaning (``VARIABLES``;
  read them with :func:`chainermn_comm.settings.read`), in two tables: ``USER_VARIABLES``, the
  knobs a user sets, and ``INTERNAL_VARIABLES``, those that chainermn and its tools set themselves
  or that exist only for tests and simulation; ``AGREED_VARIABLES`` names those every rank must
  set alike;
- the exit statuses a job ends with when chainermn ends it;
- the name of the launch status file through which a job (the checkpointer, on rank 0) tells
  ``python -m chainermn launch`` what it loaded and how far it got (:data:`LAUNCH_STATUS_ENV`; the
  file is written and read by :mod:`chainermn_comm.launch_status`).

Names and values only: this module imports nothing of chainermn's and does no I/O, so every other
module can import it.
"""

import collections

__all__ = ['Variable', 'VARIABLES', 'USER_VARIABLES', 'INTERNAL_VARIABLES', 'AGREED_VARIABLES',
           'WATCHDOG_EXIT_STATUS', 'RANK_GONE_EXIT_STATUS',
           'PREEMPTED_EXIT_STATUS',
           'LAUNCH_STATUS_ENV',
           'ALLOW_PICKLE_ENV', 'CHECK_ENV', 'CHUNK_BYTES_ENV', 'CLUSTER_DIR_ENV', 'CLUSTER_JOB_ENV',
           'CLUSTER_TOKEN_ENV', 'CHECK_FINITE_ENV', 'CUDA_AWARE_ENV', 'DEBUG_ENV', 'DIRECT_BYTES_ENV',
           'ELASTIC_ENV', 'EXIT_NOTICE_ENV', 'FORCE_ABORT_ENV',
           'LAUNCH_RESTARTS_ENV', 'NODE_LOCAL_ENV', 'OVERLAP_BUCKET_BYTES_ENV', 'OVERLAP_MODE_ENV',
           'POWERSGD_JIT_ENV', 'PROCESS_WIDE_ENV',
           'RANKS_PER_NODE_ENV', 'SHM_CHUNK_BYTES_ENV', 'SHM_REDUCE_ENV', 'SLURM_PMI_FIX_ENV',
           'STALL_SECONDS_ENV', 'START_FRESH_ENV', 'STRAGGLER_ENV', 'THREADS_ENV',
           'THREADS_CHOSEN_ENV', 'TIMEOUT_ENV', 'TRACE_ENV',
           'TRACE_EVENTS_ENV', 'TRUST_SHARED_ENV', 'TUNE_ENV', 'UNRESPONSIVE_SECONDS_ENV']

#: Exit status of a job that the watchdog ended (a rank was blocked longer than the timeout).
WATCHDOG_EXIT_STATUS = 14
#: Exit status of a job that a waiting rank ended because another rank left (its program ended
#: with status 0 or an unknown one) or stopped answering, while it waited in a call that rank
#: will never join.  A rank that left with a non-zero status gives the job that status instead.
RANK_GONE_EXIT_STATUS = 15
#: Exit status of a job that wrote its preemption checkpoint and stopped (EX_TEMPFAIL).
PREEMPTED_EXIT_STATUS = 75


class Variable(collections.namedtuple('Variable', 'name kind default meaning choices minimum '
                                                  'maximum off agreed internal')):
    """One ``CHAINERMN_*`` variable.

    ``kind`` is ``'flag'`` (1/0, true/false, yes/no, on/off), ``'int'``, ``'float'``,
    ``'choice'`` (one of ``choices``, case-insensitive), ``'tristate'`` (a flag, or unset/``auto``
    for None) or ``'text'`` (any string, e.g. a path).  Numbers outside ``minimum``..``maximum``
    are refused, except ``off`` (e.g. 0 for a time limit that 0 turns off).  ``agreed``: the
    variable changes what a rank sends, so every rank of a communicator must give it the same
    value (True), the same value set or unset alike (``'exact'``: setting it pins a knob), or
    all set it or none (``'set'``), checked when a communicator is made
    (:mod:`chainermn_comm.same_settings`).  ``internal``: set by chainermn or its tools, or only
    for tests and simulation (:data:`INTERNAL_VARIABLES`), not a user's knob.
    """

    __slots__ = ()


def _var(name, kind, default, meaning, choices=(), minimum=None, maximum=None, off=None,
         agreed=False, internal=False):
    return Variable(name, kind, default, meaning, tuple(choices), minimum, maximum, off, agreed,
                    internal)


#: Largest piece of a chunked transfer a size variable may ask for (1 GiB: larger pieces only
#: cost memory, and MPI-3 libraries count in ints).
_MAX_PIECE_BYTES = 1 << 30
#: Most threads per pool a variable may ask for (more than any machine's CPUs; threadpoolctl and
#: the libraries take a C int).
_MAX_THREADS = 1 << 16


ALLOW_PICKLE_ENV = 'CHAINERMN_ALLOW_PICKLE'
CHECK_ENV = 'CHAINERMN_CHECK'
CHECK_FINITE_ENV = 'CHAINERMN_CHECK_FINITE'
CHUNK_BYTES_ENV = 'CHAINERMN_CHUNK_BYTES'
CLUSTER_DIR_ENV = 'CHAINERMN_CLUSTER_DIR'
CLUSTER_JOB_ENV = 'CHAINERMN_CLUSTER_JOB'
CLUSTER_TOKEN_ENV = 'CHAINERMN_CLUSTER_TOKEN'
CUDA_AWARE_ENV = 'CHAINERMN_CUDA_AWARE'
DEBUG_ENV = 'CHAINERMN_DEBUG'
DIRECT_BYTES_ENV = 'CHAINERMN_DIRECT_BYTES'
ELASTIC_ENV = 'CHAINERMN_ELASTIC'
EXIT_NOTICE_ENV = 'CHAINERMN_EXIT_NOTICE'
FORCE_ABORT_ENV = 'CHAINERMN_FORCE_ABORT_ON_EXCEPTION'
LAUNCH_RESTARTS_ENV = 'CHAINERMN_LAUNCH_RESTARTS'
#: Set by ``python -m chainermn launch``: the launch status file (:mod:`chainermn_comm.launch_status`).
LAUNCH_STATUS_ENV = 'CHAINERMN_LAUNCH_PROGRESS'
NODE_LOCAL_ENV = 'CHAINERMN_NODE_LOCAL'
OVERLAP_BUCKET_BYTES_ENV = 'CHAINERMN_OVERLAP_BUCKET_BYTES'
OVERLAP_MODE_ENV = 'CHAINERMN_OVERLAP_MODE'
POWERSGD_JIT_ENV = 'CHAINERMN_POWERSGD_JIT'
#: ``0`` leaves the process alone: nothing process-wide installed (:mod:`chainermn_comm.process`).
PROCESS_WIDE_ENV = 'CHAINERMN_PROCESS_WIDE'
RANKS_PER_NODE_ENV = 'CHAINERMN_RANKS_PER_NODE'
SHM_CHUNK_BYTES_ENV = 'CHAINERMN_SHM_CHUNK_BYTES'
SHM_REDUCE_ENV = 'CHAINERMN_SHM_REDUCE'
SLURM_PMI_FIX_ENV = 'CHAINERMN_SLURM_PMI_FIX'
STALL_SECONDS_ENV = 'CHAINERMN_STALL_SECONDS'
START_FRESH_ENV = 'CHAINERMN_START_FRESH'
STRAGGLER_ENV = 'CHAINERMN_STRAGGLER'
THREADS_ENV = 'CHAINERMN_THREADS'
#: Set by chainermn: the number it exported in ``OMP_NUM_THREADS`` & co (``chainermn_comm.threads``).
THREADS_CHOSEN_ENV = 'CHAINERMN_THREADS_CHOSEN'
TIMEOUT_ENV = 'CHAINERMN_TIMEOUT'
TRACE_ENV = 'CHAINERMN_TRACE'
TRACE_EVENTS_ENV = 'CHAINERMN_TRACE_EVENTS'
TRUST_SHARED_ENV = 'CHAINERMN_TRUST_SHARED'
TUNE_ENV = 'CHAINERMN_TUNE'
UNRESPONSIVE_SECONDS_ENV = 'CHAINERMN_UNRESPONSIVE_SECONDS'

#: The variables a user may set, by name.  Defaults of sizes live with the code that uses them
#: (None here means "the code's default").
USER_VARIABLES = collections.OrderedDict((v.name, v) for v in [
    _var(ALLOW_PICKLE_ENV, 'flag', False, 'let the checkpointer unpickle snapshots you trust'),
    _var(CHECK_ENV, 'flag', True, 'check that all ranks call the same collective (0 skips it)',
         agreed=True),
    _var(CHECK_FINITE_ENV, 'choice', 'off', 'check every rank\'s gradient for NaN/Inf at each update '
         'of the multi-node optimizer and name the rank: skip (skip that update) or raise (off: no '
         'check)', choices=('off', 'skip', 'raise'), agreed=True),
    _var(CHUNK_BYTES_ENV, 'int', None, 'bytes per piece of the chunked gradient all-reduce',
         minimum=64, maximum=_MAX_PIECE_BYTES, agreed=True),
    _var(CLUSTER_DIR_ENV, 'text', None, 'where namespace clusters keep their state (default '
         '/run/chainermn-cluster; root-owned, mode 0700)'),
    _var(CUDA_AWARE_ENV, 'tristate', None, 'whether MPI may be handed GPU memory (unset: detect)'),
    _var(DEBUG_ENV, 'flag', False, 'check every collective\'s arguments across ranks',
         agreed=True),
    _var(DIRECT_BYTES_ENV, 'int', None, 'arrays at least this big are all-reduced in place',
         minimum=64, maximum=1 << 40, agreed=True),
    _var(EXIT_NOTICE_ENV, 'flag', True, 'tell the other ranks when this rank\'s program ends, so that '
         'a rank waiting for it ends the job at once (0: off)', agreed=True),
    _var(FORCE_ABORT_ENV, 'flag', False, 'abort every rank when one raises (global except hook)'),
    _var(OVERLAP_BUCKET_BYTES_ENV, 'int', None, 'bytes per bucket of the overlapped all-reduce',
         minimum=64, maximum=_MAX_PIECE_BYTES, agreed=True),
    _var(OVERLAP_MODE_ENV, 'choice', '', 'when overlapped buckets are averaged (stream: on a side '
         'CUDA stream even with one rank)', choices=('thread', 'inline', 'end', 'stream'),
         agreed=True),
    _var(POWERSGD_JIT_ENV, 'flag', True, 'run PowerSGD\'s host products as loops compiled by Numba where '
         'every rank has it (0: NumPy and BLAS)'),
    _var(PROCESS_WIDE_ENV, 'flag', True, 'install chainermn\'s process-wide handlers (the uncaught-'
         'exception hook, the sys.exit wrapper, the Trainer.run patch) and size the thread pools '
         '(OMP_NUM_THREADS & co); 0: leave the process alone (docs/process.md)'),
    _var(SHM_CHUNK_BYTES_ENV, 'int', None, 'bytes per piece of the node-shared-memory sum',
         minimum=64, maximum=_MAX_PIECE_BYTES, agreed=True),
    _var(SHM_REDUCE_ENV, 'flag', True, 'sum gradients in node-shared memory (0 uses MPI only)',
         agreed='exact'),
    _var(SLURM_PMI_FIX_ENV, 'flag', True, 'repair Slurm\'s PMI environment for MPICH'),
    _var(STALL_SECONDS_ENV, 'float', 60.0, 'seconds a call waits before the stall report (0: off)',
         minimum=1, off=0),
    _var(START_FRESH_ENV, 'flag', False, 'start from iteration 0 when no snapshot can be used'),
    _var(STRAGGLER_ENV, 'flag', True, 'name a rank that keeps arriving late at the gradient '
         'all-reduce (0 turns the live detection off)', agreed=True),
    _var(THREADS_ENV, 'int', None, 'threads per BLAS and OpenMP pool of each rank (unset: its share '
         'of the node\'s CPUs; 0: leave the pools alone)', minimum=0, maximum=_MAX_THREADS),
    _var(TRUST_SHARED_ENV, 'flag', False, 'trust directories and files that other users own or '
         'can write (checkpoints, traces): only for directories you really share (docs/security.md)'),
    _var(TUNE_ENV, 'flag', True, 'choose chunk and bucket sizes, shared memory and the overlap mode '
         'by timing the first updates (0: the defaults; each size\'s own variable pins it)',
         agreed=True),
    _var(TIMEOUT_ENV, 'float', 1800.0, 'seconds a rank may block before the watchdog ends the job '
         '(0: off)', minimum=1, off=0),
    _var(TRACE_ENV, 'text', None, 'record a timeline of every rank into this directory '
         '(docs/trace.md)', agreed='set'),
    _var(TRACE_EVENTS_ENV, 'int', 200000, 'trace events kept per rank (the oldest are dropped)',
         minimum=1000, maximum=100000000),
    _var(UNRESPONSIVE_SECONDS_ENV, 'float', 240.0, 'seconds a rank may leave the stall inspector\'s '
         'progress queries unanswered before a waiting rank declares it gone and ends the job (0: '
         'off)', minimum=1, off=0),
])

#: The variables that chainermn and its tools set themselves (launcher, cluster, the thread rule's
#: export) or that exist only for tests and simulation: read like the others, never a user's knob.
INTERNAL_VARIABLES = collections.OrderedDict((v.name, v._replace(internal=True)) for v in [
    _var(CLUSTER_JOB_ENV, 'text', None, 'the namespace-cluster job a process belongs to'),
    _var(CLUSTER_TOKEN_ENV, 'text', None, 'the secret of a namespace-cluster node\'s holder (set by '
         'the cluster tool; proves the node is its own before a kill)'),
    _var(ELASTIC_ENV, 'flag', False, 'the job runs under the elastic launcher'),
    _var(LAUNCH_RESTARTS_ENV, 'int', 0, 'how many times the launcher restarted the job', minimum=0,
         maximum=1 << 20),
    _var(LAUNCH_STATUS_ENV, 'text', None, 'the launch status file the launcher reads'),
    _var(NODE_LOCAL_ENV, 'text', None, 'a directory private to this node (namespace cluster)'),
    _var(RANKS_PER_NODE_ENV, 'int', None, 'ranks per simulated node (tests and benchmarks)',
         minimum=1, maximum=1 << 16, agreed=True),
    _var(THREADS_CHOSEN_ENV, 'int', None, 'set by chainermn: the thread count it exported in '
         'OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS', minimum=1,
         maximum=_MAX_THREADS),
])

#: Every variable chainermn reads, by name (the user's, then the internal ones): what the one
#: parser (:mod:`chainermn_comm.settings`) reads.
VARIABLES = collections.OrderedDict(list(USER_VARIABLES.items()) + list(INTERNAL_VARIABLES.items()))

#: The variables every rank of a communicator must set alike (they change what a rank sends).
AGREED_VARIABLES = tuple(name for name, v in VARIABLES.items() if v.agreed)
