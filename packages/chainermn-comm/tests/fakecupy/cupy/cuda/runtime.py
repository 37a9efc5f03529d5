"""``cupy.cuda.runtime`` stand-in: ``$CUPY_FAKE_DEVICES`` devices (default 8), host memcpy."""

import ctypes
import os

__all__ = ['CUDARuntimeError', 'getDevice', 'setDevice', 'getDeviceCount', 'runtimeGetVersion',
           'driverGetVersion', 'getDeviceProperties', 'memcpyAsync', 'memcpy', 'memcpyDeviceToDevice',
           'memcpyHostToDevice', 'memcpyDeviceToHost', 'deviceSynchronize']

memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = range(5)

_device = [0]


class CUDARuntimeError(RuntimeError):
    """What CuPy raises for a failing runtime call."""


def getDeviceCount():
    return int(os.environ.get('CUPY_FAKE_DEVICES', '8'))


def getDevice():
    return _device[0]


def setDevice(device):
    if not 0 <= int(device) < getDeviceCount():
        raise CUDARuntimeError('cudaErrorInvalidDevice: device {}'.format(device))
    _device[0] = int(device)


def runtimeGetVersion():
    return 12040


def driverGetVersion():
    return 12040


def getDeviceProperties(device):
    return {'name': b'Fake GPU (NumPy)', 'totalGlobalMem': 80 << 30, 'multiProcessorCount': 132,
            'major': 9, 'minor': 0}


def memcpy(dst, src, size, kind):
    ctypes.memmove(int(dst), int(src), int(size))


def memcpyAsync(dst, src, size, kind, stream):
    ctypes.memmove(int(dst), int(src), int(size))


def deviceSynchronize():
    pass
