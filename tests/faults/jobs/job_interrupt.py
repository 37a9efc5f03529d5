"""Fault job (issue 54): a trainer with a multi-node checkpointer, to be ended with Ctrl-C.

Usage: job_interrupt.py OUT [hook]

Trains a tiny classifier for (practically) ever, a checkpoint every 50 iterations under OUT/cp;
at iteration 60 rank 0 writes OUT/ready (the test then sends SIGINT to the launcher).  ``hook``:
the global except hook is installed.
"""

import os
import sys

import numpy as np

import chainer
import chainer.links as L
from chainer import training

import chainermn

OUT = sys.argv[1]
if sys.argv[2:] == ['hook']:
    chainermn.global_except_hook.add_hook()
comm = chainermn.create_communicator('naive')
model = L.Classifier(L.Linear(4, 3))
optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
optimizer.setup(model)
rng = np.random.RandomState(0)
data = chainer.datasets.TupleDataset(rng.rand(4000, 4).astype('f'), rng.randint(0, 3, 4000).astype('i'))
data = chainermn.scatter_dataset(data if comm.rank == 0 else None, comm)
updater = training.StandardUpdater(chainer.iterators.SerialIterator(data, 4), optimizer)
trainer = training.Trainer(updater, (10 ** 7, 'iteration'), out=OUT)
checkpointer = chainermn.create_multi_node_checkpointer('cp', comm, path=os.path.join(OUT, 'cp'))
checkpointer.maybe_load(trainer, optimizer)
trainer.extend(checkpointer, trigger=(50, 'iteration'))


@training.make_extension(trigger=(60, 'iteration'))
def ready(trainer):
    if comm.rank == 0 and trainer.updater.iteration == 60:
        with open(os.path.join(OUT, 'ready.tmp'), 'w') as f:
            f.write('60')
        os.replace(os.path.join(OUT, 'ready.tmp'), os.path.join(OUT, 'ready'))


trainer.extend(ready)
trainer.run()
