"""A CuPy that cannot be imported (test_v7_module_paths: ``chainermn.nccl`` imports without CuPy)."""

raise ImportError('CuPy is hidden for this test')
