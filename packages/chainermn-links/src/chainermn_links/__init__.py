"""chainermn-links: model-parallel links and differentiable communication functions."""

from chainermn_links import functions, links, testing
from chainermn_links.chain_list import MultiNodeChainList

__version__ = '2.0.0'

__all__ = ['MultiNodeChainList', 'functions', 'links', 'testing', '__version__']
