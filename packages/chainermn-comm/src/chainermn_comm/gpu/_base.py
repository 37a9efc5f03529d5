"""Device-aware communicator base: gradient packing, device bcast/allreduce, CUDA-aware MPI paths."""

import numpy

from chainermn_comm import _arrays
from chainermn_comm.reduce import dtypes as _dtypes
from chainermn_comm.reduce import tune as _tune
from chainermn_comm.guard import stable_code
from chainermn_comm._mpi_base import (ArrayMessage, MpiCommunicatorBase, _Fail, _raise_if_failed,
                                      op_name)
from chainermn_comm.gpu import _cuda_aware
from chainermn_comm.gpu import _kernels
from chainermn_comm.gpu import _layout

__all__ = ['GpuCommunicatorBase', 'HOST_CHUNK_BYTES']

#: Piece size of host-staged MPI reductions (reused buffers; see ARCHITECTURE: big messages).
HOST_CHUNK_BYTES = 4 * 1024 * 1024
_MAX_PIECE = 1 << 30


def _dev_bytes(a):
    import cupy
    return a.reshape(-1).view(cupy.uint8)


class GpuCommunicatorBase(MpiCommunicatorBase):
    """MPI communicator that keeps CuPy arrays on the device where it can.

    Subclasses implement ``_sum_buffer(buf, layout)`` (sum a packed gradient buffer over all
    ranks in place), and may override ``_device_allreduce`` and ``_device_bcast``.
    """

    name = 'gpu'

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None, batched_copy=False, timeout=None):
        super().__init__(mpi_comm=mpi_comm, allreduce_grad_dtype=allreduce_grad_dtype,
                         batched_copy=batched_copy, timeout=timeout)
        import cupy  # NOQA: fail here, not at first use, when CuPy is missing
        self.cuda_aware, self.cuda_aware_reason = _cuda_aware.detect_cuda_aware()
        self._packer = _kernels.GradPacker(batched=self.batched_copy)
        self._setup()

    def _set_config(self, name, value):
        super()._set_config(name, value)
        if name == 'batched_copy':
            self._packer.batched = self.batched_copy

    def _setup(self):
        """Create sub-communicators (collective; called once from __init__)."""

    def _release(self):
        """Wait for queued device work, drop the packing buffers, then release the MPI resources."""
        import cupy
        cupy.cuda.get_current_stream().synchronize()
        self._packer.release()
        super()._release()

    def _grad_align(self):
        """Return the multiple packed gradient buffers are padded to (node size for reduce-scatter)."""
        return 1

    # -- helpers ---------------------------------------------------------
    def _check_device(self, arr, what):
        _arrays.check_current_device(arr, what, self.rank)

    def _sync(self):
        """Wait for the current stream: NCCL calls return before their work is done."""
        import cupy
        cupy.cuda.get_current_stream().synchronize()

    def _mpi_bcast_dev(self, comm, arr, root):
        """Broadcast contiguous device ``arr`` over MPI ``comm`` (device pointers only if CUDA-aware)."""
        b = _dev_bytes(arr)
        if self.cuda_aware:
            self._sync()
            for start in range(0, b.size, _MAX_PIECE):
                comm.Bcast(b[start:start + _MAX_PIECE], root=root)
            return
        if comm.Get_rank() == root:
            self._sync()
        host = b.get() if comm.Get_rank() == root else numpy.empty(b.size, numpy.uint8)
        for start in range(0, host.size, _MAX_PIECE):
            comm.Bcast(host[start:start + _MAX_PIECE], root=root)
        if comm.Get_rank() != root:
            b.set(host)

    def _mpi_allreduce_dev(self, comm, arr, op='sum', wire=None):
        """All-reduce contiguous device ``arr`` in place over MPI ``comm`` (``wire='bfloat16'``: its
        uint16 words, which MPI sums widened to float32 and rounded once)."""
        mpi_op = _dtypes.reduction_op(op)
        if comm.Get_size() == 1:
            return
        if wire is not None:
            import cupy
            wide = _kernels.cast_scale(arr, cupy.empty(arr.size, numpy.float32), 1.0, src_name=wire)
            self._mpi_allreduce_dev(comm, wide, op)
            _kernels.cast_scale(wide, arr, 1.0, dst_name=wire)
            return
        if self.cuda_aware:
            from mpi4py import MPI
            self._sync()
            try:
                comm.Allreduce(MPI.IN_PLACE, arr, mpi_op)
                return
            except MPI.Exception:
                if arr.dtype != numpy.float16:
                    raise
            wide = arr.astype(numpy.float32)
            self._sync()
            comm.Allreduce(MPI.IN_PLACE, wide, mpi_op)
            arr[...] = wide
            return
        self._sync()
        host = arr.get()
        _host_allreduce_inplace(comm, host.reshape(-1), mpi_op)
        arr.set(host)

    # -- gradients ---------------------------------------------------------
    def _device_averaging(self):
        return {'device_mean': self._mean_device, 'device_wire_tuned': self._device_wire_tuned}

    def _mean_device(self, grads, wire):
        """Average CuPy ``grads`` on the device; return False (nothing done) unless all are CuPy arrays."""
        if not grads or not all(_arrays.is_device(g) for g in grads):
            return False
        for g in grads:
            self._check_device(g, 'allreduce_grad')
        scale = 1.0 / self.size
        tuning = self._device_tuning(wire)
        grad_dtype = wire if tuning is None else tuning.begin()['dtype']
        if _tune.is_auto(grad_dtype):  # one rank: nothing crosses a wire
            grad_dtype = None
        with self._guard.device_timed():  # while tracing: the GPU's time, not the host's
            for buf_dtype, idx in _group(grads, grad_dtype):
                arrays = [grads[i] for i in idx]
                plan = self._packer.plan(arrays, buf_dtype, align=self._grad_align())
                buf = self._packer.buffer(buf_dtype, plan.layout.padded, 'grad')
                # Scale before any narrowing cast: float16 sums cannot overflow, small values survive.
                self._packer.pack(arrays, buf, plan, scale=scale)
                self._sum_buffer(buf, plan.layout, _layout.BFLOAT16 if plan.buf_name == _layout.BFLOAT16
                                 else None)
                self._packer.unpack(buf, arrays, plan, scale=1.0)
        if tuning is not None:
            if tuning.timing:
                self._sync()  # the time of the device work, not of queueing it
            tuning.end()
        return True

    def _device_wire_tuned(self, wire):
        """Return whether the device wire ``'auto'`` finished its first schedule; None: no device tuner."""
        tuning = self.__dict__.get('_device_wire_tuning') if _tune.is_auto(wire) else None
        if tuning is None:  # host gradients, or no device wire to tune
            return None
        return tuning.tuner is not None and not tuning.tuner.tuning

    def _device_tuning(self, wire):
        """Return the tuner of the device wire (``wire='auto'``), or None."""
        if not _tune.is_auto(wire) or self.size == 1:
            return None
        tuning = self.__dict__.get('_device_wire_tuning')
        if tuning is None:
            tuning = self.__dict__['_device_wire_tuning'] = _tune.CallTuning(
                self._mpi_comm, 'multi_node_mean_grad(device)', _tune.wire_axes, {'dtype': None})
        return tuning

    def _sum_buffer(self, buf, layout, wire=None):
        """Sum the packed device buffer ``buf`` over all ranks in place (``wire``: its words' type)."""
        self._mpi_allreduce_dev(self._mpi_comm, buf, 'sum', wire)

    def _bcast_params(self, params):
        arrays = [p.array for p in params]
        if not arrays or not all(_arrays.is_device(a) for a in arrays):
            return super()._bcast_params(params)
        for a in arrays:
            self._check_device(a, 'bcast_data')
        with self._guard.device_timed():
            self._bcast_device_params(arrays)

    def _bcast_device_params(self, arrays):
        is_root = self.rank == 0
        floats = [i for i, a in enumerate(arrays) if a.dtype in _layout.SUPPORTED_FLOATS]
        others = [i for i in range(len(arrays)) if i not in set(floats)]
        for buf_dtype, idx in _group([arrays[i] for i in floats], None):
            group = [arrays[floats[i]] for i in idx]
            plan = self._packer.plan(group, buf_dtype)
            buf = self._packer.buffer(buf_dtype, plan.layout.padded, 'bcast')
            if is_root:
                self._packer.pack(group, buf, plan)
            self._device_bcast(buf, 0)
            if not is_root:
                self._packer.unpack(buf, group, plan)
        for i in others:
            a = arrays[i]
            tmp = a if a.flags.c_contiguous else a.copy()
            self._device_bcast(tmp, 0)
            if tmp is not a:
                a[...] = tmp

    # -- array collectives ---------------------------------------------------
    def _device_bcast(self, arr, root):
        """Broadcast contiguous device ``arr`` from ``root`` in place."""
        self._mpi_bcast_dev(self._mpi_comm, arr, root)

    def _device_allreduce(self, arr, op):
        """All-reduce contiguous device ``arr`` in place; return False to fall back to host staging."""
        if not self.cuda_aware:
            return False
        self._mpi_allreduce_dev(self._mpi_comm, arr, op)
        return True

    def allreduce(self, data, op='sum'):
        if not _arrays.is_device(data):
            return super().allreduce(data, op)
        import cupy
        self._check_device(data, 'allreduce')
        name = op_name(op, _dtypes.reduction_op(op))
        _dtypes.check_numeric(data, 'allreduce', self.rank)
        out = cupy.array(data, order='C', copy=True)
        sig = (('shape', out.shape), ('dtype', out.dtype.str), ('op', name))
        with self._guard('allreduce', sig, key=(out.shape, stable_code(out.dtype), stable_code(name))):
            done = self._device_allreduce(out.reshape(-1), op)
        if done:
            return out
        return super().allreduce(data, op)

    def bcast(self, data, max_buf_len=None, root=0):
        import cupy
        root, call = self._rooted('bcast', root, self._max_buf_len_problem(max_buf_len))
        with call:
            arr = None
            if self.rank == root:
                try:
                    if _arrays.is_device(data):
                        self._check_device(data, 'bcast')
                        arr = cupy.ascontiguousarray(data)
                        header = ('device', arr.shape, arr.dtype.str)
                    else:
                        arr = self._host_array(data, 'bcast')
                        header = ('host', arr.shape, arr.dtype.str)
                except (TypeError, ValueError) as e:
                    header = _Fail(str(e))
            else:
                header = None
            header = self._mpi_comm.bcast(header, root=root)
            _raise_if_failed([header], self.rank, 'bcast from root {}'.format(root))
            kind, shape, dtype = header
            if kind == 'device':
                if self.rank == root:
                    out = arr
                else:
                    out = cupy.empty(shape, dtype=numpy.dtype(dtype))
                if out.size:
                    self._device_bcast(out, root)
                return out
            out = arr if self.rank == root else numpy.empty(shape, dtype=numpy.dtype(dtype))
            piece = _MAX_PIECE if max_buf_len is None else min(int(max_buf_len), _MAX_PIECE)
            b = out.reshape(-1).view(numpy.uint8)
            for start in range(0, b.size, piece):
                self._mpi_comm.Bcast(b[start:start + piece], root=root)
            return out

    # -- point to point --------------------------------------------------------
    def send(self, data, dest, tag):
        dest = self._check_rank(dest, 'dest')
        tag = self._check_tag(tag)
        is_tuple = isinstance(data, (tuple, list))
        items = list(data) if is_tuple else [data]
        bufs = []
        for x in items:
            if _arrays.is_device(x):
                import cupy
                self._check_device(x, 'send')
                x = cupy.ascontiguousarray(x)
                bufs.append((x, True))
            else:
                bufs.append((self._host_array(x, 'send'), False))
        header = ArrayMessage([(b.shape, b.dtype.str) for b, _ in bufs], is_tuple, [d for _, d in bufs])
        with self._guard('send', (), collective=False, dest=dest, tag=tag,
                         shapes=[b.shape for b, _ in bufs]):
            self._pkl.send(header, dest=dest, tag=tag)
            if any(d for _, d in bufs):
                self._sync()
            for b, on_dev in bufs:
                if on_dev and not self.cuda_aware:
                    b = b.get()
                raw = _dev_bytes(b) if _arrays.is_device(b) else b.reshape(-1).view(numpy.uint8)
                self._send_bytes(raw, dest, tag)

    def recv(self, source, tag):
        from mpi4py import MPI
        import cupy
        from chainermn_comm._errors import CommunicationError
        source = self._check_rank(source, 'source')
        tag = self._check_tag(tag)
        with self._guard('recv', (), collective=False, source=source, tag=tag):
            header = self._recv_header(source, tag)
            outs = []
            status = MPI.Status()
            for (shape, dtype), dev in zip(header.specs, header.on_device):
                dt = numpy.dtype(dtype)
                direct = dev and self.cuda_aware
                out = cupy.empty(shape, dt) if direct else numpy.empty(shape, dt)
                raw = _dev_bytes(out) if direct else out.reshape(-1).view(numpy.uint8)
                for start in range(0, max(1, raw.size), _MAX_PIECE):
                    piece = raw[start:start + _MAX_PIECE]
                    self._mpi_comm.Recv(piece, source=source, tag=tag, status=status)
                    if status.Get_count(MPI.BYTE) != piece.size:
                        raise CommunicationError(
                            'rank {}: recv from rank {} (tag {}) expected {} bytes for shape {} dtype {} '
                            'but got {}'.format(self.rank, source, tag, piece.size, shape, dt,
                                                status.Get_count(MPI.BYTE)))
                if dev and not direct:
                    out = cupy.asarray(out)
                outs.append(out)
        return tuple(outs) if header.is_tuple else outs[0]

    # -- gather-like collectives -----------------------------------------------------
    def allgather(self, x):
        if not (self.cuda_aware and _arrays.is_device(x)):
            return super().allgather(x)
        import cupy
        self._check_device(x, 'allgather')
        with self._guard('allgather', ()):
            x = cupy.ascontiguousarray(x)
            headers = self._mpi_comm.allgather((x.shape, x.dtype.str))
            counts = [int(numpy.prod(s)) * numpy.dtype(d).itemsize for s, d in headers]
            recv = cupy.empty(sum(counts), dtype=cupy.uint8)
            self._sync()
            self._mpi_comm.Allgatherv(_dev_bytes(x), [recv, counts])
            outs = []
            off = 0
            for (shape, dtype), n in zip(headers, counts):
                outs.append(recv[off:off + n].view(numpy.dtype(dtype)).reshape(shape).copy())
                off += n
            return tuple(outs)


def _group(arrays, buf_dtype):
    """Return [(buffer dtype, [indices])] sorted by dtype so every rank packs in the same order.

    The buffer dtype is a NumPy float dtype or ``'bfloat16'`` (the wire, held as uint16 words).
    """
    groups = {}
    bf16 = buf_dtype is not None and _layout.dtype_name(buf_dtype) == _layout.BFLOAT16
    for i, a in enumerate(arrays):
        dt = _layout.BFLOAT16 if bf16 else numpy.dtype(buf_dtype) if buf_dtype is not None else a.dtype
        if (not bf16 and dt not in _layout.SUPPORTED_FLOATS) or a.dtype not in _layout.SUPPORTED_FLOATS:
            raise TypeError('GPU gradient paths support float16/32/64 arrays; got {} (shape {})'.format(
                a.dtype, a.shape))
        groups.setdefault(dt, []).append(i)
    return sorted(groups.items(), key=lambda kv: _layout.dtype_name(kv[0]))


def _host_allreduce_inplace(comm, flat, mpi_op):
    """All-reduce a 1-D host array in place in pieces of HOST_CHUNK_BYTES (float16 widened if needed)."""
    from mpi4py import MPI
    step = max(1, HOST_CHUNK_BYTES // flat.dtype.itemsize)
    for start in range(0, flat.size, step):
        view = flat[start:start + step]
        try:
            comm.Allreduce(MPI.IN_PLACE, view, mpi_op)
        except MPI.Exception:
            if flat.dtype != numpy.float16:
                raise
            wide = view.astype(numpy.float32)
            comm.Allreduce(MPI.IN_PLACE, wide, mpi_op)
            view[...] = wide
