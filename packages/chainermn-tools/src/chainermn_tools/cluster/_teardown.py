"""Remove a cluster, and sweep this registry's clusters whose owner process died.

Only what the state proves this cluster created goes (``_proofs``): holders carrying its token,
interfaces with their recorded ifindex, namespaces and directories with their recorded device and
inode. Names of other registries' clusters, or anything a state merely names, are never touched:
there is no sweep of "orphan" names.
"""

import os
import shutil

from chainermn_tools.cluster import _hosts, _net, _proofs, _registry

__all__ = ['teardown', 'sweep']


def teardown(base, state):
    """Kill the nodes of ``state`` and delete what it proves it created; then its state directory.

    ``state`` is this process's own or one ``_state.validate`` accepted; ``base`` None leaves the
    state directory (the registry could not be opened).
    """
    token = state.get('token')
    nodes = state.get('nodes', [])
    for node in nodes:
        _proofs.kill_holder(node.get('holder_pid'), node.get('holder_start'), token)
    for node in nodes:
        if _proofs.link_is_ours(node['link'], node.get('link_ifindex')):
            _net.delete_link(node['link'])
        etc = os.path.join(_hosts.NETNS_ETC, node['netns'])
        if _proofs.dir_is_ours(etc, node.get('etc_id')):
            _hosts.remove_netns_files(node['netns'])
        if _proofs.netns_is_ours(node['netns'], node.get('netns_id')):
            _net.delete_netns(node['netns'])
    if _proofs.link_is_ours(state['bridge'], state.get('bridge_ifindex')):
        _net.delete_link(state['bridge'])
    scratch = state.get('scratch')
    if scratch and _proofs.dir_is_ours(scratch, state.get('scratch_id')):
        shutil.rmtree(scratch, ignore_errors=True)
    if base is not None:
        _registry.remove_state(base, state['prefix'])


def sweep(base, states):
    """Tear down the clusters of ``states`` (validated, of ``base``) whose owner is dead; return the live ones.

    Call with the registry lock held.
    """
    live = {}
    for prefix, state in states.items():
        if _registry.alive(state['owner_pid'], state.get('owner_start')):
            live[prefix] = state
        else:
            teardown(base, state)
    return live
