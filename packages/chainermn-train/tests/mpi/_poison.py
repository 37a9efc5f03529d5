"""A pickled payload for the checkpoint tests: unpickling it creates a marker file."""


class Payload:
    """Unpickling this creates the file ``path`` (what an attacker's shell command would do)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))
