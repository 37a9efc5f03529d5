"""A cluster state is used only when it is exactly what the registry writes (no root needed)."""

import copy
import ipaddress

import pytest

from chainermn_tools.cluster import _state

REG = '/run/chainermn-cluster'


def good():
    state = _state.new_state(REG, 'cmn01f', 0x1f, ipaddress.ip_network('198.18.31.0/24'), 2)
    state.update(scratch='/var/tmp/chainermn-cmn01f-ab_cd123', scratch_id=[1, 2], bridge_ifindex=7)
    state['nodes'][1].update(holder_pid=1234, holder_start=99, link_ifindex=9, netns_id=[4, 5],
                             etc_id=[6, 7])
    return state


def test_what_the_registry_writes_is_accepted():
    assert _state.validate(REG, 'cmn01f', good()) is None


def _set(path, value):
    def change(state):
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


@pytest.mark.parametrize('change,why', [
    (_set(['nodes', 0, 'netns'], '/tmp/victim-dir'), 'netns'),
    (_set(['nodes', 0, 'netns'], '../../tmp/victim'), 'netns'),
    (_set(['nodes', 0, 'netns'], 'cmn01f-node0/../x'), 'netns'),
    (_set(['nodes', 1, 'netns'], 'cmn01f-node0'), 'netns'),
    (_set(['nodes', 0, 'link'], 'eth0'), 'link'),
    (_set(['nodes', 0, 'link'], 'cmn020-v0'), 'link'),
    (_set(['bridge'], 'docker0'), 'bridge'),
    (_set(['registry'], '/var/tmp/chainermn-cluster'), 'registry'),
    (_set(['version'], 1), 'version'),
    (_set(['prefix'], 'cmn020'), 'prefix'),
    (_set(['index'], 0x20), 'prefix'),
    (_set(['token'], 'x' * 32), 'token'),
    (_set(['scratch'], '/tmp/victim'), 'scratch'),
    (_set(['scratch'], '/var/tmp/chainermn-cmn01f-ab_cd123/../../etc'), 'scratch'),
    (_set(['nodes', 1, 'holder_pid'], 1), 'holder'),
    (_set(['nodes', 1, 'holder_pid'], True), 'holder'),
    (_set(['nodes', 1, 'link_ifindex'], '9'), 'identities'),
    (_set(['nodes'], []), 'node list'),
    (lambda s: s.clear(), 'version'),
])
def test_anything_else_is_refused_saying_why(change, why):
    state = copy.deepcopy(good())
    change(state)
    got = _state.validate(REG, 'cmn01f', state)
    assert got is not None and why in got, got


def test_not_an_object_is_refused():
    assert 'JSON object' in _state.validate(REG, 'cmn01f', ['cmn01f'])
