"""ChainerMN dataset scattering and multi-node iterators"""

__all__ = []
