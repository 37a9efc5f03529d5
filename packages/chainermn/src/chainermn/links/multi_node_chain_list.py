"""``chainermn.links.multi_node_chain_list`` (v7's path): ``MultiNodeChainList``."""

from chainermn_links import MultiNodeChainList

__all__ = ['MultiNodeChainList']
