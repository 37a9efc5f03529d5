"""Remove a cluster completely, and sweep clusters whose owner process died."""

import os
import signal
import time

from chainermn_tools.cluster import _hosts, _net, _registry

__all__ = ['teardown', 'sweep']


def _kill_holder(pid, start):
    if not _registry.alive(pid, start):
        return
    try:
        os.kill(pid, signal.SIGKILL)        # PID 1 of the node: the kernel ends every process of it
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while _registry.alive(pid, start) and time.monotonic() < deadline:
        time.sleep(0.005)


def teardown(base, state):
    """Kill every node of ``state``, delete its links, namespaces, /etc/netns entries and directory."""
    for node in state.get('nodes', []):
        _kill_holder(node.get('holder_pid'), node.get('holder_start'))
    for node in state.get('nodes', []):
        _net.delete_link(node['link'])
        _net.delete_netns(node['netns'])
        _hosts.remove_netns_files(node['netns'])
    if state.get('bridge'):
        _net.delete_link(state['bridge'])
    if state.get('prefix'):
        _registry.remove_state(base, state['prefix'])


def _orphans(live_prefixes):
    """Names (netns, links, /etc/netns entries) of ours that belong to no live cluster."""
    def ours(name):
        return _registry.NAME_RE.match(name) and name.split('-', 1)[0] not in live_prefixes

    netns = [n for n in os.listdir('/run/netns') if ours(n)] if os.path.isdir('/run/netns') else []
    links = [n for n in os.listdir('/sys/class/net') if ours(n)]
    etc = [n for n in os.listdir(_hosts.NETNS_ETC) if ours(n)] if os.path.isdir(_hosts.NETNS_ETC) else []
    return netns, links, etc


def sweep(base, states):
    """Remove the clusters in ``states`` whose owner is dead and any orphan of ours; return live states.

    Call with the registry lock held.
    """
    live = {}
    for prefix, state in states.items():
        if state and _registry.alive(state.get('owner_pid'), state.get('owner_start')):
            live[prefix] = state
        else:
            state = dict(state or {}, prefix=prefix)
            teardown(base, state)
    netns, links, etc = _orphans(set(live))
    for name in links:
        _net.delete_link(name)
    for name in netns:
        _net.delete_netns(name)
    for name in etc:
        _hosts.remove_netns_files(name)
    return live
