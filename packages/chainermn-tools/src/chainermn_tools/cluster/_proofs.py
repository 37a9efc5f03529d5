"""Prove that a process, interface, namespace or directory is the one a cluster of ours created.

Nothing named in a state file is killed or deleted on its name alone: a node holder must be the
process that started at the recorded time AND carry the cluster's secret token in its environment
(``/proc/PID/environ``, readable only by its own user and root), and is then killed through a
pidfd so that a recycled pid is never hit; an interface must have the recorded ifindex; a
namespace (``/run/netns/NAME``) and a directory the recorded device and inode, and a directory
must be a real directory of this user.
"""

import hmac
import os
import select
import signal
import stat
import time

from chainermn_comm import settings
from chainermn_comm.protocol import CLUSTER_TOKEN_ENV

from chainermn_tools.cluster._registry import process_start

__all__ = ['TOKEN_ENV', 'NETNS_RUN', 'holder_is_ours', 'kill_holder', 'netns_id', 'netns_is_ours',
           'link_ifindex', 'link_is_ours', 'dir_id', 'dir_is_ours']

#: The variable that carries a cluster's secret token in each of its node holders' environment.
TOKEN_ENV = CLUSTER_TOKEN_ENV
NETNS_RUN = '/run/netns'


def _environ(pid):
    try:
        with open('/proc/{}/environ'.format(pid), 'rb') as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for entry in raw.split(b'\0'):
        key, eq, value = entry.partition(b'=')
        if eq:
            env[key.decode(errors='surrogateescape')] = value.decode(errors='surrogateescape')
    return env


def holder_is_ours(pid, start, token):
    """Return True when ``pid`` started at ``start`` and carries ``token`` in its environment."""
    if pid is None or start is None or not token or process_start(pid) != start:
        return False
    got = settings.read(TOKEN_ENV, environ=_environ(pid))
    return isinstance(got, str) and hmac.compare_digest(got.encode(), token.encode())


def _gone(fd, timeout):
    return bool(select.select([fd], [], [], timeout)[0])


def kill_holder(pid, start, token, timeout=10.0):
    """SIGKILL the node holder ``pid`` (its node's PID 1: the kernel ends the node) once proven ours.

    Return True when it was ours and is gone, False when it was not proven ours (left alone).
    """
    if pid is None:
        return False
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        fd = None           # no pidfd here (kernel < 5.3): the pid and start time must do
    try:
        # Proven after the pidfd is open: a pid recycled before the open fails the proof, one
        # recycled after it leaves the pidfd on the dead process, which no signal reaches.
        if not holder_is_ours(pid, start, token):
            return False
        if fd is not None:
            if not _gone(fd, 0):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            return _gone(fd, timeout)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while process_start(pid) == start and time.monotonic() < deadline:
            time.sleep(0.005)
        return process_start(pid) != start
    except ProcessLookupError:
        return True
    finally:
        if fd is not None:
            os.close(fd)


def netns_id(name):
    """Return ``[device, inode]`` of the network namespace ``/run/netns/NAME``, or None."""
    try:
        st = os.stat(os.path.join(NETNS_RUN, name))
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def netns_is_ours(name, ident):
    """Return True when the namespace ``name`` exists and is the one recorded as ``ident``."""
    return ident is not None and netns_id(name) == list(ident)


def link_ifindex(name):
    """Return the ifindex of the interface ``name`` of this network namespace, or None."""
    try:
        with open('/sys/class/net/{}/ifindex'.format(name)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def link_is_ours(name, ifindex):
    """Return True when the interface ``name`` exists with the recorded ``ifindex``."""
    return ifindex is not None and link_ifindex(name) == ifindex


def dir_id(path):
    """Return ``[device, inode]`` of the directory ``path`` (not followed if a link)."""
    st = os.lstat(path)
    return [st.st_dev, st.st_ino]


def dir_is_ours(path, ident):
    """Return True when ``path`` is a real directory of this user with the recorded ``ident``."""
    if ident is None:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and [st.st_dev, st.st_ino] == list(ident))
