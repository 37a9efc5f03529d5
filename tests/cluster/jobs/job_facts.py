"""Cluster job: write what each rank sees of its node (topology, host, node-local dir, /dev/shm) as JSON.

usage: job_facts.py OUT_DIR    (writes OUT_DIR/facts.<rank>.json)
"""

import json
import os
import socket
import sys

from mpi4py import MPI

import chainermn_comm


def main(out_dir):
    comm = chainermn_comm.create_communicator('naive')
    host = socket.gethostname()
    local = os.environ['CHAINERMN_NODE_LOCAL']
    mark = 'mark.{}'.format(comm.rank)
    with open(os.path.join(local, mark), 'w') as f:
        f.write(host)
    with open(os.path.join('/dev/shm', 'chainermn-cluster-test.' + mark), 'w') as f:
        f.write(host)
    comm.mpi_comm.Barrier()
    facts = {
        'rank': comm.rank, 'size': comm.size, 'intra_rank': comm.intra_rank,
        'intra_size': comm.intra_size, 'inter_rank': comm.inter_rank, 'inter_size': comm.inter_size,
        'host': host, 'processor_name': MPI.Get_processor_name(),
        'ranks_per_node_env': os.environ.get('CHAINERMN_RANKS_PER_NODE'),
        'node_local': sorted(n for n in os.listdir(local) if n.startswith('mark.')),
        'shm': sorted(n for n in os.listdir('/dev/shm') if n.startswith('chainermn-cluster-test.')),
        'addresses': sorted(socket.gethostbyname('node{}'.format(i)) for i in range(comm.inter_size)),
        'pids_visible': len([p for p in os.listdir('/proc') if p.isdigit()]),
    }
    comm.mpi_comm.Barrier()
    with open(os.path.join(out_dir, 'facts.{}.json'.format(comm.rank)), 'w') as f:
        json.dump(facts, f)


if __name__ == '__main__':
    main(sys.argv[1])
