"""``chainermn.links.create_mnbn_model`` (v7's path): the module of ``create_mnbn_model``."""

from chainermn_links.links import create_mnbn_model

__all__ = ['create_mnbn_model']
