"""Run under srun --mpi=pmi2: PMI-1 puts of given line lengths straight to slurmstepd, then a fence.

Prints `init`, `maxes`, one `LEN reply` per put, `barrier reply`, then `getI intact|lost` per
put (does the server return the value?); a reply is `none` when the
server sent nothing back within the bound (argv[1], seconds), and the rest is skipped.
"""

import os
import select
import socket
import sys

bound = float(sys.argv[1])
lengths = [int(a) for a in sys.argv[2:]]
sock = socket.socket(fileno=int(os.environ['PMI_FD']))


def ask(line):
    sock.sendall(line.encode())
    out = b''
    while not out.endswith(b'\n'):
        ready, _, _ = select.select([sock], [], [], bound)
        if not ready:
            return None
        chunk = sock.recv(4096)
        if not chunk:
            return None
        out += chunk
    return out.decode().strip()


print('init', ask('cmd=init pmi_version=1 pmi_subversion=1\n'), flush=True)
print('maxes', ask('cmd=get_maxes\n'), flush=True)
kvs = os.environ['PMI_JOBID']
sent = []
for i, length in enumerate(lengths):
    key = 'p{}-{}'.format(os.environ['PMI_RANK'], i)
    head = 'cmd=put kvsname={} key={} value='.format(kvs, key)
    sent.append((key, 'A' * (length - len(head) - 1)))
    reply = ask(head + sent[-1][1] + '\n')
    print(length, reply or 'none', flush=True)
    if reply is None:
        break
else:
    barrier = ask('cmd=barrier_in\n')
    print('barrier', barrier or 'none', flush=True)
    for i, (key, value) in enumerate(sent if barrier else []):
        got = ask('cmd=get kvsname={} key={}\n'.format(kvs, key))
        state = 'none' if got is None else 'intact' if got.endswith('value=' + value) else 'lost'
        print('get{}'.format(i), state, flush=True)
sys.stdout.flush()
os._exit(0)
