"""A job killed at one point of a background save, and the job that resumes after it.

Run by test_background_checkpoint_mpi.py at 2 ranks: ``write PATH POINT@RANK HOW`` saves
iterations 5 and 10 (agreed complete), arms the kill hook, saves 15 and agrees on it (the process
named is SIGKILLed at that point, so the job ends there), with ``settle`` (as at the next save) or
with ``poll`` every iteration (as the extension's trigger does); ``resume PATH [WANT]`` loads (at any
number of ranks), checks it loaded WANT (default: 15 when every rank's file of it is there, else
10) and prints what it loaded.
"""

import os
import sys

import chainer
import numpy

import chainermn_comm
from chainermn_train import create_multi_node_checkpointer
from chainermn_train.checkpoint.write import background


class Model(chainer.Link):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.W = chainer.Parameter(numpy.zeros((256, 256), numpy.float32))


def write(comm, path, arm, how):
    cp = create_multi_node_checkpointer('k', comm, path=path, cp_interval=1, gc_interval=1, background=True)
    model = Model()
    for it in (5, 10):
        cp.settle()
        model.W.array[...] = it
        cp.save(model, iteration=it)
        model.W.array[...] = -1   # training goes on: what was copied at the save is written
    cp.settle()   # 10 is complete
    background.kill_at = arm
    model.W.array[...] = 15
    cp.save(model, iteration=15)
    model.W.array[...] = -1
    if how == 'poll':
        while not cp.poll():   # each poll stands for a training iteration
            model.W.array[...] -= 1
    else:
        cp.settle()
    os.write(1, 'DONE rank {}\n'.format(comm.rank).encode())   # one write: never split


def resume(comm, path, want=None):
    if want is None:
        complete15 = all(os.path.exists(os.path.join(path, 'k.{}.15'.format(r)))
                         for r in range(comm.size))
        want = 15 if complete15 else 10
    cp = create_multi_node_checkpointer('k', comm, path=path, cp_interval=1, gc_interval=1, background=True)
    model = Model()
    got = cp.maybe_load(model)
    assert got == want, (got, want)
    assert (model.W.array == want).all(), model.W.array[0, :4]
    comm.allreduce_obj(0)
    left = sorted(os.listdir(path))
    assert 'k.{}.15'.format(comm.rank) not in left or want == 15, left   # an incomplete one is removed
    assert not [n for n in left if n.startswith('.k.{}.'.format(comm.rank)) and n.endswith('.tmp')], left
    print('LOADED {} rank {}'.format(got, comm.rank), flush=True)


def main():
    comm = chainermn_comm.create_communicator('naive')
    if sys.argv[1] == 'write':
        write(comm, sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        resume(comm, sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)


if __name__ == '__main__':
    main()
