"""Resharding: resuming a generation on another number of ranks, or another partition of the state.

- ``resize``: what a generation records about the job that wrote it (world size, iteration,
  each iterator's position), and how a job of another size takes the shared state and moves its
  iterators to the same point of their new shards;
- ``state_shares``: sharded optimizer state (``shard_state=True``): the partition each file
  records, and gathering every old rank's share for a job that partitions otherwise.
"""

__all__ = []
