"""Files that tie the nodes together: /etc/netns hosts files, the mpiexec host file, the launcher."""

import os
import shutil
import stat

from chainermn_comm import safe_files

from chainermn_tools.cluster._registry import NAME_RE
from chainermn_tools.cluster._support import ClusterUnavailable

__all__ = ['hosts_text', 'write_netns_hosts', 'remove_netns_files', 'core_slices', 'write_hostfile',
           'write_launcher']

NETNS_ETC = '/etc/netns'

# Hydra's ssh launcher runs `PROGRAM -x HOST COMMAND...`, COMMAND quoted for a remote shell.  This
# program enters HOST's namespaces instead (no ssh daemon).
_LAUNCHER = '''#!/bin/sh
# chainermn cluster {prefix}: Hydra's ssh launcher replacement (-launcher-exec); enters a node.
while [ $# -gt 0 ]; do
  case "$1" in -x|-q|-T) shift ;; *) break ;; esac
done
host="$1"; shift
case "$host" in
{cases}
  *) echo "chainermn cluster {prefix}: no node named '$host' (nodes: {names})" >&2; exit 255 ;;
esac
exec nsenter --target "$pid" --mount --uts --ipc --net --pid --root -- /bin/sh -c "exec $*"
'''


def hosts_text(head_name, head_address, names, addresses):
    """Return an /etc/hosts that resolves the head and every node."""
    lines = ['127.0.0.1 localhost', '::1 localhost ip6-localhost ip6-loopback',
             '{} {}'.format(head_address, head_name)]
    lines += ['{} {}'.format(a, n) for n, a in zip(names, addresses)]
    return '\n'.join(lines) + '\n'


def _netns_etc():
    """Make /etc/netns (0755) if missing; refuse it unless it is a real directory of root that only root writes."""
    try:
        os.mkdir(NETNS_ETC, 0o755)
    except FileExistsError:
        pass
    st = os.lstat(NETNS_ETC)
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid())
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise safe_files.UntrustedPathError(
            'chainermn cluster: refusing {}: it must be a directory of root that only root can write '
            '(`ip netns exec` mounts what it holds over /etc); it is {} of {}, mode {:04o}. Remove it '
            'or fix it.'.format(NETNS_ETC, 'a link' if stat.S_ISLNK(st.st_mode) else 'an entry',
                                safe_files.describe_owner(st.st_uid), stat.S_IMODE(st.st_mode)))


def write_netns_hosts(netns, text, created=None):
    """Make ``/etc/netns/NETNS`` (new) and write its ``hosts`` (``ip netns exec`` bind-mounts it over /etc/hosts).

    ``created(path)`` is called as soon as the directory exists, before anything is written in it.
    """
    if not NAME_RE.match(netns):
        raise ValueError('not a cluster namespace name: {!r}'.format(netns))
    d = os.path.join(NETNS_ETC, netns)
    for attempt in range(3):    # an older chainermn's teardown may remove an empty /etc/netns meanwhile
        _netns_etc()
        try:
            os.mkdir(d, 0o755)
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
        except FileExistsError:
            raise ClusterUnavailable('{} already exists and is not this cluster\'s (another registry or '
                                     'user made it); remove it if it is stale'.format(d)) from None
    if created is not None:
        created(d)
    safe_files.write_text(os.path.join(d, 'hosts'), text, mode=0o644)


def remove_netns_files(netns):
    """Remove ``/etc/netns/NETNS`` (a cluster name: nothing else under /etc is ever removed)."""
    if NAME_RE.match(netns):
        shutil.rmtree(os.path.join(NETNS_ETC, netns), ignore_errors=True)


def core_slices(cpus, nodes, ranks_per_node):
    """Return each node's CPUs (one per rank, disjoint) from ``cpus``, or None when too few.

    The nodes share this machine's CPUs: a node's Hydra proxy would bind its ranks from CPU 0 up,
    the same CPUs on every node, so each node is given its own slice instead.
    """
    cpus = sorted(cpus)
    if nodes * ranks_per_node > len(cpus):
        return None
    return [cpus[i * ranks_per_node:(i + 1) * ranks_per_node] for i in range(nodes)]


def write_hostfile(path, names, ranks_per_node, slices=None):
    """Write an mpiexec host file: ``ranks_per_node`` slots on each node, bound to ``slices[i]`` if given."""
    lines = []
    for i, n in enumerate(names):
        bind = '' if slices is None else ' binding=user:' + ','.join(map(str, slices[i]))
        lines.append('{}:{}{}\n'.format(n, ranks_per_node, bind))
    safe_files.write_text(path, ''.join(lines), mode=0o600)
    return path


def write_launcher(path, prefix, names, holder_pids):
    """Write the launcher program that enters node ``names[i]`` through ``holder_pids[i]``."""
    cases = '\n'.join('  {}) pid={} ;;'.format(n, p) for n, p in zip(names, holder_pids))
    safe_files.write_text(path, _LAUNCHER.format(prefix=prefix, cases=cases, names=' '.join(names)),
                          mode=0o700)
    os.chmod(path, 0o700)   # in the private state directory; whatever the umask, it must run
    return path
