"""PID 1 of a cluster node: report ready, reap orphans, exit on SIGTERM (which ends the node).

Run by path (``python -I -S _init.py READY_FD``) so that it imports nothing but the standard
library.  When it exits the kernel kills every other process of the node's PID namespace.
"""

import os
import signal
import sys

__all__ = ['main']

_STOP = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def main(ready_fd):
    """Signal readiness on ``ready_fd``, then reap children until SIGTERM/SIGINT/SIGHUP."""
    waited = _STOP | {signal.SIGCHLD}
    for sig in waited:      # an init only receives signals it handles; they wait blocked
        signal.signal(sig, lambda *a: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    os.write(ready_fd, b'ready\n')
    os.close(ready_fd)
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if signal.sigwaitinfo(waited).si_signo in _STOP:
            return 0


if __name__ == '__main__':
    sys.exit(main(int(sys.argv[1])))
