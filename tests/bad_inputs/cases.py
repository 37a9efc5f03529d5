"""Bad-input cases: what users get wrong between ranks, and what every rank must see instead.

Run on every rank by ``mpiexec -n N python cases.py [NAME ...]`` (``test_bad_inputs.py`` does it at
2 and 3 ranks).  Each case runs on every rank and ends with an exception or a result; the runner
prints one ``BADINPUT {json}`` line per rank and case (outcome, message, seconds), and the test
checks it against the case's ``expect``: ``('error', ExceptionName, regex)`` (every rank raises it
and the message matches) or ``('result', None, regex)`` (every rank returns, ``repr`` matches).
Cases of one job leave the ranks in step (every rank ends each case), so they share a job.
"""

import json
import os
import re
import sys
import time

import numpy

CASES = []


def case(area, expect_type, expect_name, pattern):
    """Register a case: ``fn(comm)`` runs on every rank."""
    def deco(fn):
        CASES.append({'name': fn.__name__, 'area': area, 'fn': fn,
                      'expect': (expect_type, expect_name, pattern)})
        return fn
    return deco


def _linear(comm, n_out):
    import chainer.links as L
    model = L.Linear(2, n_out)
    model.W.array[...] = 1
    model.b.array[...] = 0
    return model


def _grads(model, value):
    for _, p in model.namedparams():
        p.grad = numpy.full(p.shape, value, p.dtype)


DISAGREE = r'ranks disagree on the next collective call'


# -- collectives ------------------------------------------------------------------------
@case('collectives', 'error', 'CommunicationError',
      DISAGREE + r"[\s\S]*First difference: parameter 0 is '/W' with shape \(2, 2\) dtype <f4 on rank 0 "
      r"but '/W' with shape \(3, 2\) dtype <f4 on rank 1")
def mean_grad_linear_2x2_vs_2x3(comm):
    model = _linear(comm, 2 if comm.rank == 0 else 3)
    _grads(model, comm.rank)
    comm.multi_node_mean_grad(model)


@case('collectives', 'error', 'CommunicationError',
      DISAGREE + r"[\s\S]*params has 2 arrays on rank 0 but 1 on rank 1; rank 0 also has parameter '/b'")
def mean_grad_missing_grad_without_zero_fill(comm):
    model = _linear(comm, 2)
    _grads(model, 1.0)
    if comm.rank != 0:
        model.b.grad = None
    comm.multi_node_mean_grad(model, zero_fill=False)


@case('collectives', 'error', 'CommunicationError',
      DISAGREE + r'[\s\S]*allreduce\(shape=\(2,\), dtype=<f4, op=sum\)[\s\S]*allreduce\(shape=\(3,\), '
      r'dtype=<f4, op=sum\)[\s\S]*First difference: shape is \(2,\) on rank 0 but \(3,\) on rank 1')
def allreduce_shapes_differ(comm):
    comm.allreduce(numpy.ones(2 if comm.rank == 0 else 3, numpy.float32))


@case('collectives', 'error', 'CommunicationError',
      DISAGREE + r'[\s\S]*First difference: dtype is <f4 on rank 0 but <f8 on rank 1')
def allreduce_dtypes_differ(comm):
    comm.allreduce(numpy.ones(2, numpy.float32 if comm.rank == 0 else numpy.float64))


@case('collectives', 'error', 'CommunicationError', DISAGREE + r'[\s\S]*First difference: op is sum on rank 0 '
      r'but max on rank 1')
def allreduce_ops_differ(comm):
    comm.allreduce(numpy.ones(2), op='sum' if comm.rank == 0 else 'max')


@case('collectives', 'error', 'CommunicationError', r'Invalid input on rank 1: TypeError: rank 1: allreduce needs '
      r'a numeric array')
def allreduce_strings_on_one_rank(comm):
    comm.allreduce(numpy.array(['x']) if comm.rank == 1 else numpy.ones(1))


@case('collectives', 'error', 'CommunicationError',
      DISAGREE + r"[\s\S]*First difference: parameter 0 is '/W' with shape \(2, 2\)")
def bcast_data_models_differ(comm):
    comm.bcast_data(_linear(comm, 2 if comm.rank == 0 else 3))


@case('collectives', 'error', 'CommunicationError', DISAGREE + r'[\s\S]*First difference: root is 0 on rank 0 '
      r'but 1 on rank 1')
def bcast_roots_differ(comm):
    comm.bcast(numpy.ones(2), root=min(comm.rank, 1))


@case('collectives', 'error', 'CommunicationError', r'Invalid input on rank 1: ValueError: rank 1: root=7 is '
      r'out of range')
def bcast_obj_root_out_of_range_on_one_rank(comm):
    comm.bcast_obj('x', root=7 if comm.rank == 1 else 0)


@case('collectives', 'error', 'CommunicationError', DISAGREE + r'[\s\S]*rank 0: collective call #\d+: '
      r'allreduce\(shape=\(1,\)[\s\S]*rank 1: collective call #\d+: allgather_obj\(\)')
def different_collectives(comm):
    if comm.rank == 0:
        comm.allreduce(numpy.ones(1))
    else:
        comm.allgather_obj(1)


def _unpicklable():
    return lambda: 0  # a lambda defined inside a function: pickle cannot name it


def _cannot_pickle(call, bad_rank):
    return (r'collective call #\d+ {0} fails on every rank because of invalid input on rank {1} \(host '
            r'[^)]+\)\.\nInvalid input on rank {1}: CommunicationError: rank {1} \(host [^)]+\): {0}\([^)]*\) '
            r"cannot pickle its object of type 'builtins.function' \((PicklingError|AttributeError): "
            r"[^\n]*Every rank of the call raises this error\.\n".format(call, bad_rank))


@case('collectives', 'error', 'CommunicationError', _cannot_pickle('bcast_obj', 0))
def bcast_obj_unpicklable_on_root(comm):
    comm.bcast_obj(_unpicklable() if comm.rank == 0 else None)


@case('collectives', 'error', 'CommunicationError', _cannot_pickle('gather_obj', 1))
def gather_obj_unpicklable_on_one_rank(comm):
    comm.gather_obj(_unpicklable() if comm.rank == 1 else comm.rank)


@case('collectives', 'error', 'CommunicationError', _cannot_pickle('allgather_obj', 1))
def allgather_obj_unpicklable_on_one_rank(comm):
    comm.allgather_obj(_unpicklable() if comm.rank == 1 else comm.rank)


@case('collectives', 'error', 'CommunicationError', _cannot_pickle('allreduce_obj', 1))
def allreduce_obj_unpicklable_on_one_rank(comm):
    comm.allreduce_obj(_unpicklable() if comm.rank == 1 else comm.rank)


@case('collectives', 'error', 'CommunicationError',
      r"^rank \d \(host [^)]+\): send_obj\(dest=\d, tag=5\) cannot pickle its object of type "
      r"'builtins.function' \((PicklingError|AttributeError): [\s\S]*Every rank of the call raises this "
      r"error\.$")
def send_obj_unpicklable_in_a_ring(comm):
    """Each rank sends what it cannot pickle to the next: the sender raises, the receiver too."""
    from chainermn import CommunicationError
    try:
        comm.send_obj(_unpicklable(), (comm.rank + 1) % comm.size, 5)
    except CommunicationError as e:
        sent = str(e)
    else:
        raise AssertionError('send_obj did not raise')
    try:
        comm.recv_obj((comm.rank - 1) % comm.size, tag=5)
    except CommunicationError as e:
        # The previous rank's error: the same text but for the rank, the peer and the address.
        want = sent.replace('rank {} '.format(comm.rank), 'rank {} '.format(
            (comm.rank - 1) % comm.size), 1).replace('dest={}'.format((comm.rank + 1) % comm.size),
                                                     'dest={}'.format(comm.rank))
        assert re.sub(' at 0x[0-9a-f]+', '', str(e)) == re.sub(' at 0x[0-9a-f]+', '', want), (str(e), want)
        raise


@case('collectives', 'error', 'CommunicationError', DISAGREE + r'[\s\S]*First difference: max_buf_len is '
      r'100 on rank 0 but 200 on rank 1')
def bcast_max_buf_len_differs(comm):
    comm.bcast(numpy.ones(1000), max_buf_len=100 if comm.rank == 0 else 200)


@case('collectives', 'error', 'CommunicationError', r'Invalid input on rank 1: ValueError: rank 1: max_buf_len '
      r"must be a positive int \(bytes per piece\) or None; got 'x'")
def bcast_max_buf_len_not_a_number_on_one_rank(comm):
    comm.bcast(numpy.ones(10), max_buf_len='x' if comm.rank == 1 else 100)


@case('collectives', 'error', 'ValueError', r'gather needs the same shape and dtype on every rank; got '
      r'rank 0: \(2,\) <f8, rank 1: \(3,\) <f8')
def gather_shapes_differ(comm):
    comm.gather(numpy.ones(2 if comm.rank == 0 else 3))


@case('collectives', 'error', 'ValueError', r'scatter from root 0 failed because of invalid input on rank 0: '
      r'rank 0: scatter needs exactly \d items on root')
def scatter_too_few_items_on_root(comm):
    comm.scatter([numpy.ones(1)] if comm.rank == 0 else None)


@case('collectives', 'error', 'ValueError', r'alltoall failed because of invalid input on rank 1: rank 1: '
      r'alltoall needs exactly \d arrays')
def alltoall_wrong_count_on_one_rank(comm):
    n = comm.size + (1 if comm.rank == 1 else 0)
    comm.alltoall([numpy.ones(1)] * n)


# -- data: scattering and iterators ----------------------------------------------------------------
@case('data', 'error', 'ValueError', r'scatter_dataset needs the same root and force_equal_length on every rank'
      r'[\s\S]*rank 0: root=0 force_equal_length=True[\s\S]*rank 1: root=1')
def scatter_dataset_roots_differ(comm):
    import chainermn
    chainermn.scatter_dataset(list(range(10)), comm, root=min(comm.rank, 1))


@case('data', 'error', 'ValueError', r'root must be an int rank in \[0, \d\); got 9')
def scatter_dataset_root_out_of_range(comm):
    import chainermn
    chainermn.scatter_dataset(list(range(10)), comm, root=9)


@case('data', 'result', None, r'^\d+$')
def scatter_dataset_smaller_than_ranks(comm):
    """Documented: every rank gets a part of equal length (samples repeat when needed)."""
    import chainermn
    return len(chainermn.scatter_dataset([1], comm))


@case('data', 'error', 'ValueError', r'create_synchronized_iterator needs the same dataset length, batch_size, '
      r'repeat and shuffling on every rank')
def synchronized_iterator_lengths_differ(comm):
    import chainer
    import chainermn
    it = chainer.iterators.SerialIterator(list(range(10 + comm.rank)), 2)
    chainermn.iterators.create_synchronized_iterator(it, comm)


@case('data', 'error', 'IteratorMismatchError', r'rank_master')
def multi_node_iterator_masters_differ(comm):
    import chainer
    import chainermn
    it = chainer.iterators.SerialIterator(list(range(10)), 2)
    chainermn.iterators.create_multi_node_iterator(it, comm, rank_master=min(comm.rank, 1))


@case('data', 'error', 'IteratorMismatchError', r'next/reset/serialize')
def multi_node_iterator_next_on_one_rank_reset_on_another(comm):
    import chainer
    import chainermn
    it = chainermn.iterators.create_multi_node_iterator(chainer.iterators.SerialIterator([1, 2, 3], 1), comm)
    if comm.rank == 0:
        it.next()
    else:
        it.reset()


# -- links and functions ---------------------------------------------------------------------------
@case('links', 'error', 'CommunicationError', r'MultiNodeBatchNormalization with \(\d,\) channels[\s\S]*'
      + DISAGREE + r'[\s\S]*First difference: shape is \(4,\) on rank 0 but \(5,\) on rank 1')
def batch_normalization_sizes_differ(comm):
    import chainermn
    size = 3 if comm.rank == 0 else 4
    bn = chainermn.links.MultiNodeBatchNormalization(size, comm)
    bn(numpy.ones((2, size), numpy.float32))


@case('links', 'error', 'CommunicationError', r'Invalid input on rank 1: ValueError: rank 1: '
      r'MultiNodeBatchNormalization of size \(3,\) got input of shape \(2, 4\)')
def batch_normalization_input_wrong_on_one_rank(comm):
    import chainermn
    bn = chainermn.links.MultiNodeBatchNormalization(3, comm)
    bn(numpy.ones((2, 4 if comm.rank == 1 else 3), numpy.float32))


@case('links', 'error', 'CommunicationError', r'Invalid input on rank 1: ValueError: rank 1: functions.alltoall '
      r'needs a tuple/list of \d variables')
def functions_alltoall_wrong_count_on_one_rank(comm):
    import chainer
    import chainermn
    n = comm.size - (1 if comm.rank == 1 else 0)
    chainermn.functions.alltoall(comm, [chainer.Variable(numpy.ones(1, numpy.float32))] * n)


@case('links', 'error', 'CommunicationError', r'Invalid input on rank 1: ValueError: rank 1: functions.bcast root '
      r'must be an int')
def functions_bcast_root_invalid_on_one_rank(comm):
    import chainer
    import chainermn
    x = chainer.Variable(numpy.ones(2, numpy.float32))
    chainermn.functions.bcast(comm, x, root=-1 if comm.rank == 1 else 0)


@case('links', 'result', None, r"^'(root got shapes \(2,\) \(3,\)( \(4,\))?|sent)'$")
def functions_gather_shapes_differ(comm):
    """Documented (as in Chainer v7): each rank sends its own shape; the root gets one per rank."""
    import chainer
    import chainermn
    ys = chainermn.functions.gather(comm, chainer.Variable(numpy.ones(2 + comm.rank, numpy.float32)))
    if comm.rank == 0:
        return 'root got shapes ' + ' '.join(str(y.shape) for y in ys)
    return 'sent'


# -- train: optimizer, evaluator, persistents, checkpointer -------------------------------------------
@case('train', 'error', 'ValueError', r"hold other parameters than its rank 0 \(this rank: (the same as "
      r"rank 0|has /W \(3, 2\) <f4 where rank 0 has /W \(2, 2\) <f4)\)")
def optimizer_models_differ(comm):
    import chainer
    import chainermn
    model = _linear(comm, 2 if comm.rank == 0 else 3)
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
    opt.setup(model)
    _grads(model, 1.0)
    opt.update()


@case('train', 'error', 'CommunicationError', DISAGREE + r'[\s\S]*First difference: shape is \(6,\) on rank 0 '
      r'but \(8,\) on rank 1')
def allreduce_persistent_models_differ(comm):
    import chainer.links as L
    import chainermn
    model = L.BatchNormalization(3 if comm.rank == 0 else 4)
    chainermn.extensions.AllreducePersistent(model, comm)()


@case('train', 'result', None, r"^'weighted mean'$")
def evaluator_uneven_parts(comm):
    """Documented: the mean over every rank's examples, weighted by how many each rank saw."""
    import chainer
    import chainermn

    class Ev(chainer.training.extensions.Evaluator):
        def evaluate(self):
            it = self.get_iterator('main')
            it.reset()
            values = [v for batch in it for v in batch]
            return {'mean': sum(values) / max(len(values), 1)}

    # Rank r evaluates r + 1 examples of value r.
    data = [float(comm.rank)] * (comm.rank + 1)
    ev = chainermn.create_multi_node_evaluator(
        Ev(chainer.iterators.SerialIterator(data, 1, repeat=False, shuffle=False), chainer.Link()), comm)
    got = float(ev.evaluate()['mean'])
    want = sum(r * (r + 1) for r in range(comm.size)) / sum(r + 1 for r in range(comm.size))
    return 'weighted mean' if abs(got - want) < 1e-12 else got


@case('train', 'error', 'ValueError', r'checkpointer name must be a non-empty string without path separators')
def checkpointer_bad_name(comm):
    import chainermn
    chainermn.create_multi_node_checkpointer('a/b', comm)


@case('train', 'result', None, r'^None$')
def checkpointer_resume_with_no_snapshot(comm):
    """Documented: maybe_load finds nothing and leaves the trainer as it is (every rank)."""
    import chainer
    import chainermn
    from chainermn_comm.testing import shared_tmpdir
    d = shared_tmpdir(comm, 'badinput-')
    cp = chainermn.create_multi_node_checkpointer('run', comm, path=d)
    model = _linear(comm, 2)
    opt = chainer.optimizers.SGD()
    opt.setup(model)
    updater = chainer.training.StandardUpdater(
        chainer.iterators.SerialIterator([numpy.zeros(2, numpy.float32)], 1), opt)
    trainer = chainer.training.Trainer(updater, (1, 'iteration'), out=d)
    cp.maybe_load(trainer, opt)
    return cp.get_stats()['loaded_iteration']


# -- environment variables ---------------------------------------------------------------------------
def _with_env(name, value, fn):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn()
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _env_case(name, variable, value, pattern):
    """Register a case: create_communicator with $variable=value raises ValueError on every rank."""
    def fn(comm):
        import chainermn
        _with_env(variable, value, lambda: chainermn.create_communicator('naive'))
    fn.__name__ = name
    case('environment', 'error', 'ValueError', pattern)(fn)


_env_case('env_timeout_not_a_number', 'CHAINERMN_TIMEOUT', 'soon',
          r"CHAINERMN_TIMEOUT='soon' is not understood: it takes a number >= 1, or 0 for off")
_env_case('env_stall_seconds_negative', 'CHAINERMN_STALL_SECONDS', '-1',
          r"CHAINERMN_STALL_SECONDS='-1' is not understood: it takes a number >= 1, or 0 for off")
_env_case('env_ranks_per_node_not_a_number', 'CHAINERMN_RANKS_PER_NODE', 'zero',
          r"CHAINERMN_RANKS_PER_NODE='zero' is not understood: it takes an integer from 1 to 65536")
_env_case('env_chunk_bytes_not_a_number', 'CHAINERMN_CHUNK_BYTES', '4MB',
          r"CHAINERMN_CHUNK_BYTES='4MB' is not understood: it takes an integer from 64 to 1073741824")
_env_case('env_chunk_bytes_too_small', 'CHAINERMN_CHUNK_BYTES', '1',
          r"CHAINERMN_CHUNK_BYTES='1' is not understood: it takes an integer from 64 to 1073741824")
_env_case('env_chunk_bytes_too_large', 'CHAINERMN_CHUNK_BYTES', '50000000000000',
          r"CHAINERMN_CHUNK_BYTES='50000000000000' is not understood: it takes an integer from 64 to ")
_env_case('env_timeout_too_small_to_be_meant', 'CHAINERMN_TIMEOUT', '1e-9',
          r"CHAINERMN_TIMEOUT='1e-9' is not understood: it takes a number >= 1, or 0 for off")
_env_case('env_unresponsive_negative', 'CHAINERMN_UNRESPONSIVE_SECONDS', '-1',
          r"CHAINERMN_UNRESPONSIVE_SECONDS='-1' is not understood: it takes a number >= 1, or 0 for off")
_env_case('env_exit_notice_not_a_flag', 'CHAINERMN_EXIT_NOTICE', 'maybe',
          r"CHAINERMN_EXIT_NOTICE='maybe' is not understood: it takes 1 or 0")
_env_case('env_check_finite_unknown', 'CHAINERMN_CHECK_FINITE', 'always',
          r"CHAINERMN_CHECK_FINITE='always' is not understood: it takes one of off, skip, raise")
_env_case('env_check_not_a_flag', 'CHAINERMN_CHECK', 'abc',
          r"CHAINERMN_CHECK='abc' is not understood: it takes 1 or 0")
_env_case('env_debug_not_a_flag', 'CHAINERMN_DEBUG', 'abc',
          r"CHAINERMN_DEBUG='abc' is not understood: it takes 1 or 0")


# -- runner -----------------------------------------------------------------------------------------
def _run(comm, entry):
    comm.mpi_comm.Barrier()
    t0 = time.monotonic()
    try:
        value = entry['fn'](comm)
        outcome = {'outcome': 'result', 'type': None, 'message': repr(value)}
    except Exception as e:
        outcome = {'outcome': 'error', 'type': type(e).__name__, 'message': str(e)}
    outcome.update(case=entry['name'], area=entry['area'], rank=comm.rank, size=comm.size,
                   seconds=time.monotonic() - t0)
    return outcome


def check(entry, outcome):
    """Return None when ``outcome`` (one rank's) is what ``entry`` expects, else why not."""
    kind, name, pattern = entry['expect']
    if outcome['outcome'] != kind:
        return 'expected {} but got {}: {} {}'.format(kind, outcome['outcome'], outcome['type'],
                                                     outcome['message'][:2000])
    if kind == 'error' and name != '*' and outcome['type'] != name:
        return 'expected {} but got {}: {}'.format(name, outcome['type'], outcome['message'][:2000])
    if not re.search(pattern, outcome['message']):
        return 'message does not match {!r}: {}'.format(pattern, outcome['message'][:2000])
    return None


def main(names):
    import chainermn
    comm = chainermn.create_communicator('naive')
    chosen = [c for c in CASES if not names or c['name'] in names]
    for entry in chosen:
        out = _run(comm, entry)
        sys.stdout.write('BADINPUT ' + json.dumps(out) + '\n')
        sys.stdout.flush()
    comm.mpi_comm.Barrier()


if __name__ == '__main__':
    main(sys.argv[1:])
