"""Version of the chainermn-comm distribution."""

__all__ = ['__version__']

__version__ = '2.0.0'
