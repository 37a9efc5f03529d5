"""How to install what chainermn-comm needs at run time: the one text for errors, the doctor and docs."""

__all__ = ['GPU_INSTALL_HINT', 'MPI_INSTALL_HINT']

#: How to get CuPy with NCCL (GPU communicators); names only distributions and extras that exist.
GPU_INSTALL_HINT = (
    'install CuPy with NCCL for your CUDA version, on a machine with an NVIDIA GPU and driver: '
    '`pip install "chainermn[gpu]"` (cupy-cuda12x, CUDA 12) or `pip install "chainermn[gpu-cuda13]"` '
    '(cupy-cuda13x, CUDA 13); chainermn-comm has the same two extras')

#: How to get an MPI library that mpi4py can load.
MPI_INSTALL_HINT = (
    'install an MPI library: `pip install mpich` (or `pip install "chainermn-comm[mpich]"`); '
    "or, on a cluster, load its MPI (e.g. `module load openmpi`, so that `mpicc` is on PATH) and "
    'build mpi4py against it: `pip install --force-reinstall --no-binary mpi4py mpi4py`')
