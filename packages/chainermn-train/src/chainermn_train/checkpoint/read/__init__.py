"""Reading and verifying snapshots: which generation the ranks load, and what they check before.

- ``load``: the ranks agree on the newest usable generation and load it (or reshard it, with
  ``reshard``);
- ``generations``: which snapshot files exist, their metadata, which generations are complete
  and which old files may be removed (all local to the rank);
- ``lineage``: whose a generation is: its run identity and the optimizer whose state it holds;
- ``npz``: the pickle-free, bounded npz format of every snapshot file, reading and writing it
  (``write.saving``, ``reshard.state_shares`` and ``multi_node_snapshot`` write through it);
- ``stored_zip``: the bytes of that format, laid out (each array at a 64-byte boundary) and
  checksummed (zlib-ng's CRC-32), for ``npz`` and for the staged files of ``write.staging``;
- ``data_order``: whether the resumed job cut its data as the run it resumes did
  (``scatter_dataset``'s order).
"""

__all__ = []
