"""``chainermn.functions.batch_normalization`` (v7's path): the backend rule, an ``impl_selector``."""

from chainermn_links.functions.batch_normalization import MultiNodeBNImplSelector, get_communication_backend

__all__ = ['get_communication_backend', 'MultiNodeBNImplSelector']
