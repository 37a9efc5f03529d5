"""The checkpoint room: generational per-rank snapshots, their files, and multi_node_snapshot.

- ``_checkpointer``: :class:`MultiNodeCheckpointer` (the trainer extension) and its factory;
- ``_saving``: a save, written before it returns or in the background (``_staging``: the host
  copy; ``_background``: the write in flight; ``_complete``: which generations are complete);
- ``_writer``: how a snapshot file is written; ``_safe_npz``: the pickle-free npz format;
- ``_generations``: which files exist and which may be collected; ``_load``: how the ranks agree
  on a generation and reshard; ``_resize``: what a generation records; ``_lineage``: whose a
  generation is (run identity, optimizer); ``_state_shares``: sharded optimizer state (the
  partition a generation records, gathering the shares); ``_owner``: which job writes a directory; ``_policy``:
  what may be trusted, the error classes, raising together; ``_launch_status``: progress for
  ``python -m chainermn launch``;
- ``_multi_node_snapshot``: Chainer's snapshot once per replica set.

The public names are re-exported by :mod:`chainermn_train.extensions` (and ``chainermn``).
"""

from chainermn_train.checkpoint._checkpointer import (MultiNodeCheckpointer,
                                                      create_multi_node_checkpoint,
                                                      create_multi_node_checkpointer)
from chainermn_train.checkpoint._multi_node_snapshot import multi_node_snapshot, parse_replica_sets
from chainermn_train.checkpoint._policy import (CheckpointInUseError, CheckpointWarning,
                                                SnapshotUnusableError, UnsafeCheckpointError)

__all__ = ['MultiNodeCheckpointer', 'create_multi_node_checkpointer', 'create_multi_node_checkpoint',
           'CheckpointWarning', 'SnapshotUnusableError', 'UnsafeCheckpointError',
           'CheckpointInUseError', 'multi_node_snapshot', 'parse_replica_sets']
