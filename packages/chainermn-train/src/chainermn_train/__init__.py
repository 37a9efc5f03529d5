"""ChainerMN multi-node optimizer, evaluator, trainer extensions and checkpoints"""

__all__ = []
