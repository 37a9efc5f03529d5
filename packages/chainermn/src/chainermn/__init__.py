"""ChainerMN: distributed training for Chainer (meta-package re-exporting the documented API)"""

__all__ = []
