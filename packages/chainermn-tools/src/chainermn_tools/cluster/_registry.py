"""The registry of this machine's clusters: a private directory, its lock, one state file per cluster.

The registry (``/run/chainermn-cluster``, or ``$CHAINERMN_CLUSTER_DIR``) names the processes,
interfaces, namespaces and directories this tool kills and deletes as root, so only its owner may
use it: it is made with mode 0700 when missing and refused, never repaired, when it is a symbolic
link, belongs to another user, lets other users in, or sits under a directory another user could
swap. Each cluster records its subnet index, owner process, secret token, names and what it
created in ``<registry>/<prefix>/state.json`` (mode 0600, written through
``chainermn_comm.safe_files``) under an exclusive lock on ``<registry>/lock``. A state directory
or file that is not this user's and private is left alone with a warning; so is a state that
fails validation (``_state.validate``). Node scratch lives apart, in a private ``mkdtemp``
directory under ``/var/tmp`` (``/run`` is often a small tmpfs).
"""

import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import stat
import warnings

from chainermn_comm import safe_files, settings
from chainermn_comm.protocol import CLUSTER_DIR_ENV

from chainermn_tools.cluster._support import ClusterUnavailable

__all__ = ['RegistryRefused', 'cluster_dir', 'open_registry', 'locked', 'process_start', 'alive',
           'read_state', 'read_states', 'write_state', 'make_state_dir', 'remove_state', 'prefix_for',
           'index_of', 'pick_index', 'names_in_use', 'PREFIX_RE', 'NAME_RE', 'MAX_CLUSTERS',
           'DEFAULT_DIR', 'SCRATCH_PARENT']

#: Environment variable that moves the registry.
DIR_ENV = CLUSTER_DIR_ENV
DEFAULT_DIR = '/run/chainermn-cluster'
#: Where each cluster's private node scratch directory is made (``mkdtemp``): room for job data.
SCRATCH_PARENT = '/var/tmp'
#: A cluster's prefix, after its subnet index; the name of its state directory.
PREFIX_RE = re.compile(r'^cmn[0-9a-f]{3}$')
#: Every interface and namespace name a cluster creates (netns, veth host ends, bridge, /etc/netns).
NAME_RE = re.compile(r'^(cmn[0-9a-f]{3})-(br|v[0-9]{1,3}|node[0-9]{1,3})$')
MAX_CLUSTERS = 512      # the /24s of 198.18.0.0/15
_STATE = 'state.json'
_MAX_STATE_BYTES = 1 << 20
_ANY_PREFIX = re.compile(r'^cmn([0-9a-f]{3})-')
_NETNS_DIRS = ('/run/netns', '/sys/class/net', '/etc/netns')


class RegistryRefused(safe_files.UntrustedPathError, ClusterUnavailable):
    """The registry directory is another user's, open to others, or a link: no cluster starts."""


def cluster_dir():
    """Return the registry directory (``$CHAINERMN_CLUSTER_DIR`` or ``/run/chainermn-cluster``), absolute."""
    return os.path.abspath(settings.read(DIR_ENV) or DEFAULT_DIR)


def _whoami():
    return safe_files.describe_owner(os.geteuid())


def _refuse(path, st, why, fix):
    raise RegistryRefused(
        'chainermn cluster: refusing the cluster registry {}: {} (owner {}, mode {:04o}). It names the '
        'processes, interfaces, namespaces and directories this tool kills and deletes as root, so it '
        'must be a directory of {} that no other user can write or read (mode 0700). {} Or set {} to '
        'a new path.'.format(path, why, safe_files.describe_owner(st.st_uid), stat.S_IMODE(st.st_mode),
                             _whoami(), fix, DIR_ENV))


def private_problem(st):
    """Return why ``st`` is not this user's and closed to others (None when it is)."""
    if st.st_uid != os.geteuid():
        return 'it belongs to {}, not to {}'.format(safe_files.describe_owner(st.st_uid), _whoami())
    if stat.S_IMODE(st.st_mode) & 0o077:
        return 'its mode {:04o} lets other users in'.format(stat.S_IMODE(st.st_mode))
    return None


def _check_ancestors(path):
    parent = os.path.dirname(path)
    while True:
        st = os.stat(parent)
        if st.st_uid not in (0, os.geteuid()):
            _refuse(path, st, 'the directory {} above it belongs to {}, who could swap it'.format(
                parent, safe_files.describe_owner(st.st_uid)), 'Use a path under directories of root.')
        if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP) and not st.st_mode & stat.S_ISVTX:
            _refuse(path, st, 'the directory {} above it can be written by other users without the '
                    'sticky bit'.format(parent), 'Use a path under directories of root.')
        up = os.path.dirname(parent)
        if up == parent:
            return
        parent = up


def open_registry():
    """Make the registry (mode 0700) if missing; return its path; raise RegistryRefused unless it is private."""
    path = cluster_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise ClusterUnavailable('chainermn cluster: cannot make the cluster registry {}: {} does not '
                                 'exist. Create it (a directory of root), or set {} to a path whose '
                                 'parent exists.'.format(path, os.path.dirname(path), DIR_ENV)) from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        _refuse(path, st, 'it is a symbolic link', 'Remove the link (`rm {}`).'.format(path))
    if not stat.S_ISDIR(st.st_mode):
        _refuse(path, st, 'it is not a directory', 'Remove it if you know what it is.')
    why = private_problem(st)
    if why and st.st_uid != os.geteuid():
        _refuse(path, st, why, 'Someone else made it: find out who, then remove it (`rm -rf {}`); '
                'never take it over, its contents are theirs.'.format(path))
    if why:
        _refuse(path, st, why, 'If you made it and nobody else put anything in it, '
                '`chmod 700 {}`; otherwise remove it (`rm -rf {}`).'.format(path, path))
    real = os.path.realpath(path)
    _check_ancestors(real)
    return real


@contextlib.contextmanager
def locked():
    """Hold the registry's exclusive lock; yield the registry path."""
    base = open_registry()
    try:
        fd = safe_files.open_lock(os.path.join(base, 'lock'), mode=0o600, allow_shared=False)
    except safe_files.UntrustedPathError as e:
        raise RegistryRefused('chainermn cluster: {} (in the cluster registry {})'.format(e, base)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield base
    finally:
        os.close(fd)


def process_start(pid):
    """Return the start time (clock ticks since boot) of ``pid``, or None if it does not exist."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        with open('/proc/{}/stat'.format(pid)) as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return int(text[text.rindex(')') + 2:].split()[19])


def alive(pid, start):
    """Return True when ``pid`` runs and is the process that started at ``start``."""
    return pid is not None and start is not None and process_start(pid) == start


def prefix_for(index):
    """Return the name prefix of the cluster on subnet ``index``."""
    return 'cmn{:03x}'.format(index)


def index_of(prefix):
    """Return the subnet index of ``prefix`` (``cmnXXX``)."""
    return int(prefix[3:], 16)


def _load(path):
    """Read a state file that must be this user's and private; return (state, None) or (None, why)."""
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return None, 'missing'
    if not stat.S_ISREG(lst.st_mode):
        return None, 'it is a symbolic link' if stat.S_ISLNK(lst.st_mode) else 'it is not a regular file'
    why = private_problem(lst)
    if why:
        return None, why
    try:
        with safe_files.open_trusted(path, 'cluster state file', allow_shared=False) as f:
            why = private_problem(os.fstat(f.fileno()))
            data = f.read(_MAX_STATE_BYTES + 1)
    except OSError as e:
        return None, 'it changed while being read ({})'.format(e)
    if why:
        return None, why
    if len(data) > _MAX_STATE_BYTES:
        return None, 'it is larger than {} bytes'.format(_MAX_STATE_BYTES)
    try:
        return json.loads(data.decode()), None
    except ValueError as e:
        return None, 'it is not JSON ({})'.format(e)


def read_state(base, prefix):
    """Return ``(state, None)`` for the state file of ``prefix``, or ``(None, why)`` when it cannot be trusted."""
    return _load(os.path.join(base, prefix, _STATE))


def _leave_alone(path, why):
    warnings.warn('chainermn cluster: leaving {} alone: {}. Nothing it names is killed or deleted, and '
                  'its subnet is not reused; remove {} yourself once you know whose it is.'.format(
                      path, why, os.path.dirname(path)), stacklevel=3)


def read_states(base, validate):
    """Return ``({prefix: state}, refused)``: states ``validate(prefix, state)`` accepts, other prefixes.

    ``validate`` returns None or why a state is not one this registry made; each refused state
    file is named once in a warning and left alone.
    """
    states, refused = {}, set()
    for prefix in sorted(os.listdir(base)):
        if not PREFIX_RE.match(prefix):
            continue
        d = os.path.join(base, prefix)
        st = os.lstat(d)
        why = ('it is not a directory' if not stat.S_ISDIR(st.st_mode) else private_problem(st))
        state = None
        if why is None:
            state, why = _load(os.path.join(d, _STATE))
            if why == 'missing' and not os.listdir(d):
                os.rmdir(d)     # made under the lock just before its state file: nothing was created
                continue
        if why is None:
            why = validate(prefix, state)
        if why is not None:
            _leave_alone(os.path.join(d, _STATE), why)
            refused.add(prefix)
        else:
            states[prefix] = state
    return states, refused


def make_state_dir(base, prefix):
    """Make ``<registry>/<prefix>`` (mode 0700, new); return its path."""
    d = os.path.join(base, prefix)
    os.mkdir(d, 0o700)
    return d


def write_state(base, state):
    """Write ``state`` atomically (mode 0600) to its cluster's state file."""
    safe_files.write_text(os.path.join(base, state['prefix'], _STATE), json.dumps(state, indent=1),
                          mode=0o600)


def remove_state(base, prefix):
    """Remove a cluster's state directory (state file, launcher, host files, node logs)."""
    if PREFIX_RE.match(prefix or ''):
        shutil.rmtree(os.path.join(base, prefix), ignore_errors=True)


def names_in_use():
    """Return the subnet indices that some ``cmnXXX-`` netns, interface or /etc/netns entry uses."""
    used = set()
    for d in _NETNS_DIRS:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            m = _ANY_PREFIX.match(name)
            if m:
                used.add(int(m.group(1), 16))
    return used


def pick_index(taken):
    """Return a free subnet index not in ``taken``, or None when all are in use."""
    free = [i for i in range(MAX_CLUSTERS) if i not in taken]
    return random.choice(free) if free else None
