"""A cluster's state file: what it holds, and the check that it is exactly what this registry writes.

The state is written before anything is created and updated right after each thing is created,
with that thing's identity (an interface's ifindex, a namespace's or directory's device and inode,
a holder's pid and start time); the secret ``token`` is in each node holder's environment. A
state read back is used only when every field is what this registry would have written: version,
registry path, prefix and index, and the exact names ``<prefix>-br``, ``<prefix>-vI``,
``<prefix>-nodeI`` (so no slash, no ``..``, no absolute path, nothing outside ``/etc/netns``).
"""

import os
import re
import secrets

from chainermn_tools.cluster import _registry

__all__ = ['VERSION', 'new_state', 'validate']

VERSION = 2
_TOKEN_RE = re.compile(r'^[0-9a-f]{32}$')
_MAX_NODES = 250


def new_state(registry, prefix, index, net, size):
    """Return the state of a new cluster of ``size`` nodes on ``net`` (nothing created yet)."""
    hosts = list(net.hosts())
    pid = os.getpid()
    return {
        'version': VERSION, 'registry': registry, 'prefix': prefix, 'index': index,
        'subnet': str(net), 'owner_pid': pid, 'owner_start': _registry.process_start(pid),
        'token': secrets.token_hex(16), 'head_address': str(hosts[0]),
        'bridge': prefix + '-br', 'bridge_ifindex': None, 'scratch': None, 'scratch_id': None,
        'nodes': [{'hostname': 'node{}'.format(i), 'address': str(hosts[i + 1]),
                   'netns': '{}-node{}'.format(prefix, i), 'netns_id': None, 'etc_id': None,
                   'link': '{}-v{}'.format(prefix, i), 'link_ifindex': None,
                   'holder_pid': None, 'holder_start': None} for i in range(size)]}


def _is_int(value, low, high=None):
    return (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def _opt_int(value, low):
    return value is None or _is_int(value, low)


def _opt_id(value):
    return value is None or (isinstance(value, list) and len(value) == 2
                             and all(_is_int(v, 0) for v in value))


def _node_problem(prefix, i, node):
    if not isinstance(node, dict):
        return 'node {} is not a JSON object'.format(i)
    want = {'hostname': 'node{}'.format(i), 'netns': '{}-node{}'.format(prefix, i),
            'link': '{}-v{}'.format(prefix, i)}
    for key, name in want.items():
        if node.get(key) != name:
            return 'node {} {} is {!r}, not {!r} as this registry names it'.format(i, key, node.get(key), name)
    if not (_registry.NAME_RE.match(node['netns']) and _registry.NAME_RE.match(node['link'])):
        return 'node {} names are not cluster names'.format(i)
    if not (_opt_id(node.get('netns_id')) and _opt_id(node.get('etc_id'))
            and _opt_int(node.get('link_ifindex'), 1)):
        return 'node {} identities are malformed'.format(i)
    if not (_opt_int(node.get('holder_pid'), 2) and _opt_int(node.get('holder_start'), 0)):
        return 'node {} holder is malformed'.format(i)
    return None


def _scratch_problem(prefix, state):
    scratch = state.get('scratch')
    if scratch is None:
        return None
    pattern = r'^{}/chainermn-{}-[a-z0-9_]{{8}}$'.format(re.escape(_registry.SCRATCH_PARENT), prefix)
    if not isinstance(scratch, str) or not re.match(pattern, scratch):
        return 'scratch is {!r}, not a directory this registry makes'.format(scratch)
    if not _opt_id(state.get('scratch_id')):
        return 'scratch_id is malformed'
    return None


def validate(registry, prefix, state):
    """Return None when ``state`` is exactly what this registry writes for ``prefix``, else why not."""
    if not isinstance(state, dict):
        return 'it is not a JSON object'
    if state.get('version') != VERSION:
        return 'its version is {!r}, not {} (another chainermn, or not ours)'.format(state.get('version'),
                                                                                 VERSION)
    if state.get('registry') != registry:
        return 'it belongs to the registry {!r}, not {}'.format(state.get('registry'), registry)
    index = state.get('index')
    if state.get('prefix') != prefix or not _is_int(index, 0, _registry.MAX_CLUSTERS - 1) \
            or _registry.prefix_for(index) != prefix:
        return 'its prefix/index {!r}/{!r} does not match its directory {}'.format(
            state.get('prefix'), index, prefix)
    if not isinstance(state.get('token'), str) or not _TOKEN_RE.match(state['token']):
        return 'its token is malformed'
    if not (_is_int(state.get('owner_pid'), 1) and _opt_int(state.get('owner_start'), 0)):
        return 'its owner is malformed'
    if state.get('bridge') != prefix + '-br' or not _opt_int(state.get('bridge_ifindex'), 1):
        return 'its bridge {!r} is not {}-br'.format(state.get('bridge'), prefix)
    why = _scratch_problem(prefix, state)
    if why:
        return why
    nodes = state.get('nodes')
    if not isinstance(nodes, list) or not 1 <= len(nodes) <= _MAX_NODES:
        return 'its node list is malformed'
    for i, node in enumerate(nodes):
        why = _node_problem(prefix, i, node)
        if why:
            return why
    return None
