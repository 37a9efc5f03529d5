"""``chainermn.testing`` (v7's path): helpers for tests of code that uses chainermn (``get_device``)."""

from chainermn.testing import device
from chainermn.testing.device import get_device

__all__ = ['device', 'get_device']
