"""``cupy.cuda`` stand-in: devices, streams and events that complete every call at once."""

import time

from cupy.cuda import runtime  # NOQA: F401

__all__ = ['Device', 'Stream', 'Event', 'get_current_stream', 'get_elapsed_time']


class Device:
    """A device id; ``use()`` and ``with Device(i):`` select it."""

    _stack = []

    def __init__(self, device=None):
        self.id = runtime.getDevice() if device is None else int(device)
        if not 0 <= self.id < runtime.getDeviceCount():
            raise runtime.CUDARuntimeError('invalid device ordinal {}'.format(self.id))

    def use(self):
        runtime.setDevice(self.id)

    def synchronize(self):
        pass

    @property
    def compute_capability(self):
        return '90'

    def __enter__(self):
        Device._stack.append(runtime.getDevice())
        self.use()
        return self

    def __exit__(self, *exc):
        runtime.setDevice(Device._stack.pop())

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return '<CUDA Device {}>'.format(self.id)


class Stream:
    """A stream; work "queued" on it has always finished."""

    _count = 0
    _current = []

    def __init__(self, null=False, non_blocking=False, ptr=None):
        Stream._count += 1
        self.ptr = 0 if null else 0x5000 + Stream._count
        self.non_blocking = non_blocking
        self.waited = []

    @property
    def done(self):
        return True

    def synchronize(self):
        pass

    def wait_event(self, event):
        if not isinstance(event, Event):
            raise TypeError('fake cupy: wait_event needs an Event; got {}'.format(type(event)))
        self.waited.append(event)

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def use(self):
        Stream._current[:] = [self]
        return self

    def __enter__(self):
        Stream._current.append(self)
        return self

    def __exit__(self, *exc):
        Stream._current.pop()


Stream.null = Stream(null=True)


def get_current_stream():
    """Return the innermost stream entered with ``with``, else the null stream."""
    return Stream._current[-1] if Stream._current else Stream.null


class Event:
    """An event that is done as soon as it is recorded.

    ``Event.waits`` counts the host waits on events (``synchronize``), so tests can check that
    nothing waits for the GPU per iteration.
    """

    waits = 0

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.block, self.disable_timing = block, disable_timing
        self.stream = None
        self._t = None
        self.device = runtime.getDevice()

    def record(self, stream=None):
        self.stream = get_current_stream() if stream is None else stream
        self._t = time.perf_counter()

    @property
    def done(self):
        return True

    def synchronize(self):
        Event.waits += 1


def get_elapsed_time(start, end):
    """Return the milliseconds between two recorded events (as CuPy: both recorded, timing on)."""
    if start.disable_timing or end.disable_timing:
        raise RuntimeError('fake cupy: timing is disabled on one of the events')
    if start._t is None or end._t is None:
        raise RuntimeError('fake cupy: get_elapsed_time of an event that was never recorded')
    if start.device != end.device:
        raise RuntimeError('fake cupy: get_elapsed_time of events of devices {} and {}'.format(
            start.device, end.device))
    return (end._t - start._t) * 1e3
