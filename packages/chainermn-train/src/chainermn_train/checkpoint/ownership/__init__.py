"""Ownership: whose directory and files these are, what may be trusted, and who cleans up.

- ``owner``: which job writes a checkpoint directory (one owner record per rank, kept fresh while
  the job lives; a live job's record refuses a second job);
- ``made``: the directories a checkpointer made, removed again by a completed run when empty;
- ``trust``: what may be trusted (pickle only on opt-in, a directory only this user writes), the
  checkpoint warning and error classes, and ``agree`` (every rank raises the same error together).
"""

__all__ = []
