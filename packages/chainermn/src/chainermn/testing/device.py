"""``chainermn.testing.device`` (v7's path): ``get_device``, the device a test runs on."""

from chainermn_links.testing import get_device

__all__ = ['get_device']
