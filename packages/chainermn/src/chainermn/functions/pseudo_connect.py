"""``chainermn.functions.pseudo_connect`` (v7's path): ``pseudo_connect`` and its node."""

from chainermn_links.functions.pseudo_connect import PseudoConnect, pseudo_connect

__all__ = ['PseudoConnect', 'pseudo_connect']
