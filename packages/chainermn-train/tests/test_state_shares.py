"""The partition a sharded generation records, and what a job decides from it (no communication)."""

import json

import chainer
import chainer.links as L

from chainermn_train.checkpoint.reshard import state_shares


def _files(owners, size, seen=None):
    text = json.dumps({'world_size': size, 'owners': owners})
    meta = {'world_size': size, state_shares.META_PREFIX + 'main': text}
    seen = seen if seen is not None else {r: [r] for r in range(size)}
    return {r: [(q, dict(meta, rank=r)) for q in qs] for r, qs in seen.items()}


OWNERS = {'l/W': 0, 'l/b': 1, 'm/W': 2}


def test_recorded_reads_the_partition_and_ignores_unsharded_generations():
    rec = state_shares.recorded(_files(OWNERS, 3))
    assert rec == {'main': {'world_size': 3, 'owners': OWNERS}}
    assert state_shares.recorded({0: [(0, {'world_size': 2})]}) == {}
    assert state_shares.recorded({0: [(0, ('unreadable', 'x'))]}) == {}
    bad = {0: [(0, {'world_size': 2, state_shares.META_PREFIX + 'main': 'not json'})]}
    assert state_shares.recorded(bad) == {}


def test_a_job_gathers_unless_it_has_the_same_partition():
    rec = state_shares.recorded(_files(OWNERS, 3))
    same = {'main': {'world_size': 3, 'owners': dict(OWNERS)}}
    assert not state_shares.needs_gather(rec, same)
    assert state_shares.needs_gather(rec, {'main': None})   # unsharded job
    assert state_shares.needs_gather(rec, {'main': {'world_size': 2, 'owners': {'l/W': 0, 'l/b': 1,
                                                                                 'm/W': 1}}})
    assert not state_shares.needs_gather(rec, {'other': None})   # not this job's optimizer


def test_missing_share_files_are_named_with_the_parameters_they_held():
    files = _files(OWNERS, 3, seen={0: [0], 1: [0, 1]})   # rank 2's file: on no rank's disk
    rec = state_shares.recorded(files)
    assert state_shares.missing_files(files, rec) == [(2, ['main:m/W'])]
    files[2] = [(1, ('unreadable', 'BadZipFile'))]
    assert state_shares.missing_files(files, rec) == [(2, ['main:m/W'])]

    class Ckpt:
        @staticmethod
        def filename(it, r):
            return '/cp/job.{}.{}'.format(r, it)

    why = state_shares.describe_missing(Ckpt, 10, [(2, ['main:m/W'])])
    assert '/cp/job.2.10 (the optimizer state of 1 parameter(s): main:m/W)' in why


def test_expected_keys_lose_the_state_that_gathering_supplies():
    class Model(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.l = L.Linear(2, 2)
                self.m = L.Linear(2, 1, nobias=True)

    opt = chainer.optimizers.Adam()
    opt.setup(Model())

    class Updater:
        @staticmethod
        def get_all_optimizers():
            return {'main': opt}

    pre = 'optimizer:main/'
    expected = {pre + 'l/W/m': (2, 2), pre + 'l/W/t': (), pre + 'l/b/v': (2,), pre + 'm/W/m': (1, 2),
                pre + 't': (), 'model:main/l/W': (2, 2)}
    rec = state_shares.recorded(_files(OWNERS, 3))
    left = state_shares.without_state(expected, Updater(), rec)
    assert left == {pre + 't': (), 'model:main/l/W': (2, 2)}
    assert state_shares.owned_paths(rec['main'], 1) == ['l/b']
