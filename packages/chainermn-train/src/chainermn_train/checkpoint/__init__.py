"""The checkpoint room: generational per-rank snapshots, their files, and multi_node_snapshot.

At the top: ``_checkpointer`` (:class:`MultiNodeCheckpointer`, the trainer extension, and its
factory), ``_multi_node_snapshot`` (Chainer's snapshot once per replica set) and
``_launch_status`` (progress for ``python -m chainermn launch``).  The extension's jobs live in
four subpackages, each one job (its ``__init__`` says which module does what):

- ``write``: a save, synchronous or in the background (``saving``, ``staging``, ``background``),
  how a file is written (``writer``) and which generations are complete (``complete``);
- ``read``: reading and verifying: how the ranks agree on a generation and load it (``load``),
  which files exist (``generations``), whose a generation is (``lineage``), the pickle-free,
  bounded file format (``npz``) and the data order check (``data_order``);
- ``reshard``: resuming on another number of ranks (``resize``) or another partition of sharded
  optimizer state (``state_shares``);
- ``ownership``: which job writes a directory (``owner``), the directories it made (``made``), and
  what may be trusted, the error classes, raising together (``trust``).

The public names are re-exported by :mod:`chainermn_train.extensions` (and ``chainermn``).
"""

from chainermn_train.checkpoint._checkpointer import (MultiNodeCheckpointer,
                                                      create_multi_node_checkpoint,
                                                      create_multi_node_checkpointer)
from chainermn_train.checkpoint._multi_node_snapshot import multi_node_snapshot, parse_replica_sets
from chainermn_train.checkpoint.ownership.trust import (CheckpointInUseError, CheckpointWarning,
                                                        SnapshotUnusableError, UnsafeCheckpointError)

__all__ = ['MultiNodeCheckpointer', 'create_multi_node_checkpointer', 'create_multi_node_checkpoint',
           'CheckpointWarning', 'SnapshotUnusableError', 'UnsafeCheckpointError',
           'CheckpointInUseError', 'multi_node_snapshot', 'parse_replica_sets']
