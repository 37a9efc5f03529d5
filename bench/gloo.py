"""PyTorch gloo contenders (optional): all-reduce of one flat tensor and in DDP's 25 MB buckets.

Used only when ``torch`` is importable; never a dependency of the packages or of CI.
"""

import os
import socket

__all__ = ['available', 'contenders', 'DDP_BUCKET_BYTES']

#: DDP's default ``bucket_cap_mb`` (25 MiB).
DDP_BUCKET_BYTES = 25 * 1024 * 1024


def available():
    """Return True when torch (with torch.distributed) can be imported."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available()


def _init(comm):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if dist.is_initialized():
        return
    if comm.Get_rank() == 0:
        host = socket.gethostname()
        addr = socket.gethostbyname(host)
        s = socket.socket()
        s.bind((addr, 0))
        port = s.getsockname()[1]
        s.close()  # a small race with other jobs; gloo binds it right after
        where = (addr, port)
    else:
        where = None
    addr, port = comm.bcast(where, root=0)
    os.environ.setdefault('GLOO_SOCKET_IFNAME', _iface_for(socket.gethostbyname(socket.gethostname())))
    dist.init_process_group('gloo', init_method='tcp://{}:{}'.format(addr, port),
                            rank=comm.Get_rank(), world_size=comm.Get_size())


def _iface_for(addr):
    """Return the interface that holds ``addr`` (eth0 on a cluster node, lo on a plain machine)."""
    try:
        import fcntl
        import struct
        for _, name in socket.if_nameindex():
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', name.encode()[:15]))
            except OSError:
                continue
            finally:
                s.close()
            if socket.inet_ntoa(raw[20:24]) == addr:
                return name
    except Exception:
        pass
    return 'lo'


def contenders(comm, nelems):
    """Return {name: fn} of gloo all-reduces of ``nelems`` float32 (collective: every rank calls it)."""
    import torch
    import torch.distributed as dist
    _init(comm)
    flat = torch.randn(nelems, dtype=torch.float32)
    step = DDP_BUCKET_BYTES // 4
    buckets = [flat[s:s + step] for s in range(0, nelems, step)]
    size = float(comm.Get_size())

    def gloo_flat():
        dist.all_reduce(flat)

    def gloo_buckets():
        # As DDP does on CPU: every bucket in flight at once, then divide by the world size.
        works = [dist.all_reduce(b, async_op=True) for b in buckets]
        for w in works:
            w.wait()
        for b in buckets:
            b.div_(size)

    return {'gloo_flat_allreduce': gloo_flat, 'gloo_ddp_buckets25MB_allreduce': gloo_buckets}
