"""Per-rank checks of what chainermn installs process-wide (run by test_process_alone_mpi.py).

``CHAINERMN_TEST_MODE``: ``default`` (everything of docs/process.md is installed), ``variable``
(``CHAINERMN_PROCESS_WIDE=0``: nothing) or ``call`` (``process.leave_alone()`` before the first
communicator: nothing).
"""

import os
import sys
import threading

import chainer
import threadpoolctl

MODE = os.environ['CHAINERMN_TEST_MODE']
ENVIRON = dict(os.environ)
EXCEPTHOOK, THREAD_HOOK, EXIT = sys.excepthook, threading.excepthook, sys.exit
RUN = chainer.training.Trainer.run

import chainermn_comm  # noqa: E402  (after noting what the process had)
import chainermn_train  # noqa: E402
from chainermn_comm import process, threads  # noqa: E402

POOLS = threadpoolctl.threadpool_info()


def _changed_environment():
    now = dict(os.environ)
    return sorted(k for k in set(now) | set(ENVIRON) if now.get(k) != ENVIRON.get(k))


def main():
    if MODE == 'call':
        process.leave_alone()
    comm = chainermn_comm.create_communicator('naive')
    model = chainer.links.Linear(2, 1)
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
    opt.setup(model)
    if MODE == 'default':
        assert sys.excepthook is not EXCEPTHOOK, 'no excepthook installed'
        assert sys.exit is not EXIT, 'sys.exit not wrapped'
        assert chainer.training.Trainer.run is not RUN, 'Trainer.run not patched'
        assert sorted(process.installed()) == ['Trainer.run', 'excepthook', 'sys.exit', 'thread pools'], \
            process.installed()
        assert _changed_environment() == ['CHAINERMN_THREADS_CHOSEN', 'MKL_NUM_THREADS',
                                          'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS'], _changed_environment()
        assert threads.current().source == 'rule'
        try:
            process.leave_alone()
        except RuntimeError as e:
            assert 'is called after chainermn installed' in str(e), e
        else:
            raise AssertionError('leave_alone() after the first communicator was taken')
    else:
        assert sys.excepthook is EXCEPTHOOK, sys.excepthook
        assert threading.excepthook is THREAD_HOOK, threading.excepthook
        assert sys.exit is EXIT, sys.exit
        assert chainer.training.Trainer.run is RUN, chainer.training.Trainer.run
        assert _changed_environment() == [], _changed_environment()
        assert threadpoolctl.threadpool_info() == POOLS
        assert process.installed() == [], process.installed()
        assert threads.current().source == 'CHAINERMN_PROCESS_WIDE' and threads.current().threads is None
        process.leave_alone()   # again: nothing was installed, so it is fine
    # The job still works: an average, then the end (the exit notice needs no wrapper).
    assert comm.allreduce_obj(comm.rank) == comm.size * (comm.size - 1) // 2
    comm.finalize()
    print('PROCESS-CHECKED {} {}'.format(MODE, comm.rank), flush=True)   # one write: ranks share the pipe


main()
