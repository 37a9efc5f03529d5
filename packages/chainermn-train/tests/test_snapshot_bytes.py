"""The bytes of a snapshot file: laid out by ``stored_zip``, staged in one aligned buffer, written
straight to the disk, over a set-aside old file, at a pace; read back by zipfile and NumPy."""

import io
import os
import stat
import sys
import types
import zipfile

import numpy
import pytest

from chainermn_comm import safe_files
from chainermn_train.checkpoint.read import npz, stored_zip
from chainermn_train.checkpoint.write import background, staging, writer


def _arrays():
    return {'big': numpy.arange(5 << 20, dtype=numpy.int64).reshape(5, -1),   # 40 MiB
            'strided': numpy.ones((2000, 300))[:, ::2], 'small': numpy.arange(7, dtype=numpy.float16),
            'scalar': numpy.float64(0.1), 'text': numpy.array('log'), 'empty': numpy.zeros((0, 3)),
            'flags': numpy.ones(3 << 20, numpy.bool_),
            'fortran': numpy.asfortranarray(numpy.arange(12.).reshape(3, 4)),
            'pred/ünï/cödé': numpy.arange(5, dtype=numpy.uint8), 'nothing': None, 'count': 7}


def _check_reads_back(data, arrays):
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None   # every member's CRC-32
        names = [i.filename for i in zf.infolist()]
    assert [n for n in names if not n.startswith('__')] == [
        k + '.npy' for k, v in arrays.items() if v is not None]   # None: listed by name
    with numpy.load(io.BytesIO(data)) as loaded:
        for key, want in arrays.items():
            if want is None:
                continue
            got = loaded[key]
            want = numpy.asarray(want)
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert numpy.array_equal(got, want), key
            if want.ndim == 2 and not want.flags.c_contiguous and want.flags.f_contiguous:
                assert got.flags.f_contiguous, key   # stored in Fortran order, as savez stores it
    values, pickled = npz.read(io.BytesIO(data))
    assert pickled == [] and values['nothing'].dtype == object and values['nothing'][()] is None


def test_an_npz_of_every_kind_of_array_reads_back_with_zipfile_numpy_and_ours():
    arrays = _arrays()
    out = io.BytesIO()
    size = npz.write(out, arrays)
    assert size is None or size == len(out.getvalue())
    _check_reads_back(out.getvalue(), arrays)


def test_each_array_starts_at_a_64_byte_boundary_of_the_file():
    arrays = npz.to_arrays(_arrays())
    layout = stored_zip.Layout(arrays)
    data = io.BytesIO()
    assert stored_zip.write(data, arrays) == layout.size == len(data.getvalue())
    raw = data.getvalue()
    for m, arr in zip(layout.members, arrays.values()):
        assert m.start % stored_zip.ALIGN == 0, m.name
        want = stored_zip.bytes_of(numpy.asanyarray(arr), m.fortran)
        assert raw[m.start:m.end] == bytes(want), m.name
        assert raw[m.offset:m.offset + 4] == b'PK\x03\x04'


def test_the_crc_is_zlibs_number():
    import zlib
    data = numpy.random.default_rng(0).integers(0, 255, 1 << 20, dtype=numpy.uint8)
    assert stored_zip.crc32(data) == zlib.crc32(data)
    assert stored_zip.crc32(data[7:], stored_zip.crc32(data[:7])) == zlib.crc32(data)


def test_a_staged_image_is_the_file_the_synchronous_writer_writes(monkeypatch):
    monkeypatch.setattr(stored_zip.time, 'time', lambda: 1e9)   # the same date in both
    values = _arrays()
    values['count'] = numpy.asarray(7)
    st = staging.Staging()
    image = st.stage(dict(values), {'iteration': 3})
    assert st._buffer.ctypes.data % staging.PAGE == 0 and st.nbytes % staging.PAGE == 0
    want = io.BytesIO()
    stored_zip.write(want, npz.to_arrays(dict(values), {'iteration': 3}))
    got = bytes(image.seal()[:image.size])
    assert got == want.getvalue()
    _check_reads_back(got, values)


def test_staging_copies_the_arrays_and_reuses_its_buffer():
    st = staging.Staging()
    a = numpy.arange(1000, dtype=numpy.float32)
    image = st.stage({'a': a}, {'iteration': 1})
    buffer = st._buffer
    a += 1   # training goes on: the staged copy keeps the value at the save
    with numpy.load(io.BytesIO(bytes(image.seal()[:image.size]))) as loaded:
        assert numpy.array_equal(loaded['a'], numpy.arange(1000, dtype=numpy.float32))
    st.stage({'a': a}, {'iteration': 2})
    assert st._buffer is buffer   # the same layout fits: no new buffer
    st.stage({'a': numpy.zeros(1 << 20)}, {'iteration': 3})
    assert st._buffer is not buffer and st.nbytes >= 8 << 20


class _Partial(io.FileIO):
    """A file whose every write writes at most ``most`` bytes, as a write to a disk may."""

    most = 3 * 4096

    def write(self, data):
        return super().write(memoryview(data)[:self.most])


class _Odd(_Partial):
    most = 3 * 4096 + 100   # then the next direct write is misaligned: refused, written buffered


@pytest.mark.parametrize('where', ['disk', 'partial', 'odd'])
def test_write_aligned_writes_exactly_the_file(tmp_path, where):
    st = staging.Staging()
    values = {'a': numpy.random.default_rng(1).random(300001), 'b': numpy.arange(3)}
    image = st.stage(values)
    path = str(tmp_path / 'snap')
    if where != 'disk':
        with (_Partial if where == 'partial' else _Odd)(path, 'w') as f:
            assert image.write_to(f, writer.write_aligned) == image.size
    else:
        assert writer.write_atomically(path, lambda f: image.write_to(f, writer.write_aligned),
                                       raw=True) == image.size
    assert os.path.getsize(path) == image.size
    with numpy.load(path) as loaded:
        assert numpy.array_equal(loaded['a'], values['a'])


def test_write_aligned_falls_back_where_the_file_system_refuses_direct_writes(tmp_path, monkeypatch):
    calls = []
    real = writer.fcntl.fcntl

    def no_direct(fd, cmd, *arg):
        if cmd == writer.fcntl.F_SETFL and arg and arg[0] & os.O_DIRECT:
            calls.append(fd)
            raise OSError(22, 'Invalid argument')
        return real(fd, cmd, *arg)

    monkeypatch.setattr(writer.fcntl, 'fcntl', no_direct)
    image = staging.Staging().stage({'a': numpy.arange(100000)})
    path = str(tmp_path / 'snap')
    writer.write_atomically(path, lambda f: image.write_to(f, writer.write_aligned), raw=True)
    assert calls, 'direct I/O was not tried'
    with numpy.load(path) as loaded:
        assert numpy.array_equal(loaded['a'], numpy.arange(100000))


def _own(path, data=b'x' * 10000):
    with open(path, 'wb') as f:
        f.write(data)
    os.chmod(path, 0o644)
    return path


def test_a_set_aside_file_is_written_over_and_cut(tmp_path):
    old = _own(str(tmp_path / 'snap.0.10'), b'old' * 100000)
    spare = writer.set_aside(old, '.snap.0.')
    assert not os.path.exists(old) and os.path.basename(spare).startswith('.snap.0.')
    assert spare.endswith('.tmp')
    inode = os.stat(spare).st_ino
    final = str(tmp_path / 'snap.0.20')
    writer.write_atomically(final, lambda f: f.write(b'new'), reuse=spare)
    assert os.stat(final).st_ino == inode   # its blocks were written over, not freed
    assert open(final, 'rb').read() == b'new' and not os.path.exists(spare)
    assert stat.S_IMODE(os.stat(final).st_mode) == 0o644 & ~safe_files.current_umask()


@pytest.mark.parametrize('kind', ['link', 'hardlink', 'writable', 'gone', 'elsewhere'])
def test_a_spare_that_changed_is_never_written_through(tmp_path, kind):
    target = _own(str(tmp_path / 'target'), b'keep')
    other = tmp_path / 'sub'
    other.mkdir()
    spare = str((other if kind == 'elsewhere' else tmp_path) / '.snap.0.abc.tmp')
    if kind == 'link':
        os.symlink(target, spare)
    elif kind == 'hardlink':
        os.link(target, spare)
    elif kind in ('writable', 'elsewhere'):
        _own(spare, b'spare')
        if kind == 'writable':
            os.chmod(spare, 0o666)
    final = str(tmp_path / 'snap.0.20')
    writer.write_atomically(final, lambda f: f.write(b'new'), reuse=spare)
    assert open(final, 'rb').read() == b'new'
    assert open(target, 'rb').read() == b'keep'
    if kind != 'gone':
        assert os.path.lexists(spare)   # left as it was (removed later with the stale files)
        assert os.lstat(spare).st_ino != os.stat(final).st_ino


def test_only_own_regular_files_are_set_aside(tmp_path):
    target = _own(str(tmp_path / 'target'))
    link = str(tmp_path / 'snap.0.10')
    os.symlink(target, link)
    assert writer.set_aside(link, '.snap.0.') is None and os.path.islink(link)
    assert writer.set_aside(str(tmp_path / 'missing'), '.snap.0.') is None


class _Clock:
    """A fake clock for a flight's pacing (waiting moves it on)."""

    def __init__(self, monkeypatch):
        self.now = 100.0
        self.waits = []
        monkeypatch.setattr(background, 'time', types.SimpleNamespace(monotonic=lambda: self.now))


def test_a_staged_write_is_spread_and_hurries_once_training_waits(monkeypatch):
    clock = _Clock(monkeypatch)
    flight = background.InFlight()   # made at 100.0
    clock.now = 102.0                # the first save, 2 s after: spread over SPREAD * 2 s
    writes = []

    class File:
        def write(self, data):
            writes.append(clock.now)
            return len(data)

    def wait(delay):
        clock.waits.append(round(delay, 6))
        clock.now += delay
        return flight._hurry

    monkeypatch.setattr(flight._hurried, 'wait', wait)
    go = background.threading.Event()
    done = background.threading.Event()

    def write():
        f = flight.file(File())
        for _ in range(4):
            f.write(b'x' * 25)
        go.wait()   # the test hurries the flight here
        for _ in range(4):
            f.write(b'x' * 25)
        done.set()
        return 200

    flight.start(1, write, nbytes=200)
    assert go.wait(0) is False and done.wait(0) is False
    while len(writes) < 4:
        background.threading.Event().wait(0.001)
    spread = background.SPREAD * 2.0
    assert [round(t - 102.0, 6) for t in writes] == [round(spread * k / 8, 6) for k in range(4)]
    flight._hurry_up()
    go.set()
    outcome = flight.wait(10)
    assert outcome.ok and outcome.size == 200
    assert len(clock.waits) == 3   # no wait once training waits for the write
    assert writes[4:] == [writes[3]] * 4


def test_the_spread_is_bounded(monkeypatch):
    clock = _Clock(monkeypatch)
    flight = background.InFlight()
    clock.now += 10000.0
    flight.start(1, lambda: 0, nbytes=10)
    assert flight._pace == (10, background.MAX_SPREAD_SECONDS)
    flight.wait(10)
    clock.now += 1.0   # a save 1 s after the one before
    flight.start(2, lambda: 0, nbytes=10)
    assert flight._pace == (10, background.SPREAD * 1.0)
    flight.wait(10)


def test_gpu_arrays_are_staged_through_pinned_memory(monkeypatch):
    pinned = []

    def alloc_pinned_memory(n):
        pinned.append(bytearray(n))   # page-aligned or not: staging aligns within it
        return pinned[-1]

    fake = types.ModuleType('cupy')
    fake.cuda = types.SimpleNamespace(alloc_pinned_memory=alloc_pinned_memory)

    class DeviceArray:
        """What staging needs of a CuPy array: shape, dtype, get(out=)."""

        def __init__(self, a):
            self._a = a
            self.shape, self.dtype = a.shape, a.dtype

        def get(self, out=None):
            assert out.flags.c_contiguous and out.ctypes.data % stored_zip.ALIGN == 0
            out[...] = self._a
            return out

    DeviceArray.__module__ = 'cupy'
    monkeypatch.setitem(sys.modules, 'cupy', fake)
    w = numpy.arange(24, dtype=numpy.float32).reshape(4, 6)
    values = {'W': DeviceArray(w), 'b': numpy.ones(3), 'empty': DeviceArray(numpy.zeros((0, 2)))}
    st = staging.Staging()
    image = st.stage(values, {'iteration': 1})
    assert len(pinned) == 1 and st._buffer.ctypes.data % staging.PAGE == 0
    assert image.crcs[0] is None   # summed by the writer thread, not while training waits
    with numpy.load(io.BytesIO(bytes(image.seal()[:image.size]))) as loaded:
        assert numpy.array_equal(loaded['W'], w) and loaded['W'].dtype == numpy.float32
        assert numpy.array_equal(loaded['b'], numpy.ones(3)) and loaded['empty'].shape == (0, 2)
    st.stage({'b': numpy.ones(3)})
    assert len(pinned) == 1 and not st._pinned   # host arrays only: a plain buffer again


def test_stale_temporary_files_of_the_records_are_removed_too(tmp_path):
    # A job killed while it wrote its complete record left '..<name>.<rank>.complete.<random>.tmp'
    # (a hidden file's temporary name has one more dot); the folder could then never be removed.
    names = ['..mnist.0.complete.k2j3.tmp', '.mnist.0.30.x8.tmp', '.mnist.0.ab12.tmp',
             '..mnist.1.complete.zz.tmp', '.mnist.1.30.q.tmp', 'mnist.0.30', '..mnist.0.complete']
    for fn in names:
        _own(str(tmp_path / fn))
    writer.remove_stale_tmp(str(tmp_path), '.mnist.0.')
    assert sorted(os.listdir(str(tmp_path))) == sorted(
        ['..mnist.1.complete.zz.tmp', '.mnist.1.30.q.tmp', 'mnist.0.30', '..mnist.0.complete'])
