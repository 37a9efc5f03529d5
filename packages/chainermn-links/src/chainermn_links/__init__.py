"""ChainerMN model-parallel links and differentiable communication functions"""

__all__ = []
