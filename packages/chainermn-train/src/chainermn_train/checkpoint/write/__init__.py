"""Writing snapshots: a save, its host copy, the write in flight, the file, and which are complete.

- ``saving``: a save, written before ``save`` returns or copied and written in the background;
  ``settle``, the agreement of every rank on what became of its saves (failures reported once);
- ``staging``: the consistent host copy of what a snapshot holds: its whole file, laid out in one
  aligned buffer reused between saves;
- ``background``: the one write in flight on a background thread, paced, waited for with a
  bound (and the crash tests' kill points);
- ``writer``: how a snapshot file is written (new name or an old one set aside, straight from
  memory where the file system allows, ``fsync``, rename) and removed;
- ``complete``: which generations are complete, recorded so that the loader can tell.

The file format itself is ``read.npz`` (one module reads and writes it), its bytes ``read.stored_zip``.
"""

__all__ = []
