"""Run under srun/mpiexec: the first chainermn calls after `import chainer`; rank 0 prints all results as one JSON line."""

import json
import os
import socket

import chainer  # noqa: F401  (imported before MPI starts: the case that broke srun --mpi=pmi2)
import chainer.links as L
import numpy

import chainermn

comm = chainermn.create_communicator('naive')
n, r = comm.size, comm.rank
total = comm.allreduce_obj(r)
x = comm.allreduce(numpy.arange(4, dtype=numpy.float32) * (r + 1))

model = L.Linear(3, 2)
model.W.array[...] = r + 7.0
comm.bcast_data(model)
for p in model.params():
    p.grad = numpy.full(p.shape, r + 1.0, dtype=p.dtype)
comm.multi_node_mean_grad(model)

data = chainermn.scatter_dataset(list(range(12)) if r == 0 else None, comm)
mine = {
    'rank': r, 'size': n, 'host': socket.gethostname(),
    'intra_rank': comm.intra_rank, 'intra_size': comm.intra_size,
    'inter_rank': comm.inter_rank, 'inter_size': comm.inter_size,
    'sum_ranks': total, 'allreduce': x.tolist(),
    'bcast_W': float(model.W.array.mean()), 'mean_grad': float(model.W.grad.mean()),
    'scatter': [int(v) for v in data],
    'netmod': os.environ.get('MPIR_CVAR_CH4_NETMOD'),
}
everyone = comm.gather_obj(mine)   # one line from rank 0: launchers may interleave ranks' output
if r == 0:
    print('RESULTS ' + json.dumps(everyone), flush=True)
