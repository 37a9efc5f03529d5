"""The gradient average: how ranks' arrays are summed and averaged (comm-internal).

A room of its own, apart from the communicators, guard, trace and settings:

- ``model_collectives``: the communicator methods on a model (``bcast_data``, ``multi_node_mean_grad``);
- ``chunked``: all-reduce in place in cache-sized pieces through reused buffers (``ChunkedReducer``);
- ``node_shared``: the ranks of a node sum through a shared-memory window (``NodeReducer``);
- ``stream``: the pipeline of copies and transfers, and polite waiting (``Pacer``);
- ``half``, ``codecs``: 16-bit wires (float16, bfloat16), summed in float32;
- ``tune``: the wire and the knobs chosen by timing the job's own calls (``Tuner``);
- ``wire``, ``dtypes``: message headers, byte views, reduction ops and wire dtypes.

Sibling packages never import this sub-package: they use its front door, :mod:`chainermn_comm.engine`.
"""
