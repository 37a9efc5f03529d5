"""Marks this directory as the chainermn meta-package (the import-precedence hook checks for it)."""

__all__ = []
