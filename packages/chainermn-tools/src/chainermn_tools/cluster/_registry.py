"""Book-keeping shared by every cluster on this machine: a lock, one state file per cluster, subnets.

Each cluster records, before it creates anything, its subnet index, its owner process and the
names it will use in ``<CLUSTER_DIR>/<prefix>/state.json``, under an exclusive lock on
``<CLUSTER_DIR>/lock``.  Another run sweeps a cluster only when its owner process is dead.
"""

import contextlib
import fcntl
import json
import os
import random
import re

from chainermn_comm.protocol import CLUSTER_DIR_ENV

__all__ = ['cluster_dir', 'locked', 'process_start', 'alive', 'read_states', 'write_state',
           'remove_state', 'prefix_for', 'NAME_RE', 'MAX_CLUSTERS']

#: Environment variable that moves the registry and the node scratch directories.
DIR_ENV = CLUSTER_DIR_ENV
DEFAULT_DIR = '/var/tmp/chainermn-cluster'    # holds node scratch too: not a small tmpfs
#: Every name a cluster creates (netns, interfaces, /etc/netns entries) matches this.
NAME_RE = re.compile(r'^cmn[0-9a-f]{3}-')
MAX_CLUSTERS = 512      # the /24s of 198.18.0.0/15


def cluster_dir():
    """Return the directory that holds the lock, the state files and node scratch directories."""
    return os.environ.get(DIR_ENV) or DEFAULT_DIR


@contextlib.contextmanager
def locked():
    """Hold the machine-wide cluster lock."""
    base = cluster_dir()
    os.makedirs(base, exist_ok=True)
    fd = os.open(os.path.join(base, 'lock'), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield base
    finally:
        os.close(fd)


def process_start(pid):
    """Return the start time (clock ticks since boot) of ``pid``, or None if it does not exist."""
    try:
        with open('/proc/{}/stat'.format(pid)) as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return int(stat[stat.rindex(')') + 2:].split()[19])


def alive(pid, start):
    """Return True when ``pid`` runs and is the process that started at ``start``."""
    return pid is not None and process_start(pid) == start


def prefix_for(index):
    """Return the name prefix of the cluster on subnet ``index``."""
    return 'cmn{:03x}'.format(index)


def read_states(base):
    """Return ``{prefix: state}`` for every recorded cluster (unreadable ones as empty dicts)."""
    states = {}
    for name in os.listdir(base):
        path = os.path.join(base, name, 'state.json')
        if NAME_RE.match(name + '-') and os.path.isdir(os.path.join(base, name)):
            try:
                with open(path) as f:
                    states[name] = json.load(f)
            except (OSError, ValueError):
                states[name] = {}
    return states


def write_state(base, state):
    """Write ``state`` atomically to its cluster's state file."""
    d = os.path.join(base, state['prefix'])
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, 'state.json.tmp')
    with open(tmp, 'w') as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, os.path.join(d, 'state.json'))


def remove_state(base, prefix):
    """Remove a cluster's directory (state file, scratch, launcher)."""
    import shutil
    shutil.rmtree(os.path.join(base, prefix), ignore_errors=True)


def pick_index(taken):
    """Return a free subnet index not in ``taken``, or None when all are in use."""
    free = [i for i in range(MAX_CLUSTERS) if i not in taken]
    return random.choice(free) if free else None
