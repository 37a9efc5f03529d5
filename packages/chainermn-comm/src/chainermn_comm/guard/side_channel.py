"""Side channel of the stall inspector: ask the other ranks how far they got, without the stuck call.

Each communicator's guard owns a duplicate of its MPI communicator used only by the watchdog
thread.  Every rank's watchdog thread answers progress queries from it about once a second
(``Iprobe``, then a small reply sent with ``isend``); a rank whose call has waited
``$CHAINERMN_STALL_SECONDS`` sends a query to every other rank and collects the replies for a few
seconds.  The happy path pays one ``Iprobe`` per second in a thread; the collectives themselves
carry nothing.  The channel needs ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it by default); without
it the stall report names only this rank's call.
"""

import itertools
import time

__all__ = ['SideChannel', 'side_channel_available', 'ANSWER_WAIT']

_REQ = 1
_REP = 2
#: Seconds a stalled rank waits for the other ranks' answers before it prints its report.
ANSWER_WAIT = 5.0
_query_ids = itertools.count(1)


def side_channel_available():
    """Return (True, '') when the watchdog thread may call MPI, else (False, why not)."""
    from mpi4py import MPI
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        return False, 'MPI was initialised without MPI_THREAD_MULTIPLE (thread level {})'.format(level)
    return True, ''


class SideChannel:
    """Progress queries and answers between the watchdog threads of all ranks of one communicator."""

    def __init__(self, mpi_comm):
        from mpi4py import MPI
        self.comm = mpi_comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.host = MPI.Get_processor_name()
        self.served = 0
        self._status = MPI.Status()
        self._sends = []
        self._query = None  # (query id, deadline, {rank: answer})

    # -- answering (every rank, every tick) ---------------------------------------------
    def serve(self, progress):
        """Answer every pending query with ``progress()``; collect answers to our own query."""
        from mpi4py import MPI
        comm, st = self.comm, self._status
        while comm.Iprobe(MPI.ANY_SOURCE, _REQ, st):
            src = st.Get_source()
            qid = comm.recv(source=src, tag=_REQ)
            self._sends.append(comm.isend((qid, progress()), dest=src, tag=_REP))
            self.served += 1
        while comm.Iprobe(MPI.ANY_SOURCE, _REP, st):
            src = st.Get_source()
            qid, answer = comm.recv(source=src, tag=_REP)
            if self._query is not None and qid == self._query[0]:
                self._query[2][src] = answer
        if self._sends:
            self._sends = [r for r in self._sends if not r.Test()]

    # -- asking (a stalled rank) ----------------------------------------------------------
    def ask(self):
        """Send a progress query to every other rank."""
        qid = next(_query_ids) * 4096 + self.rank
        self._query = (qid, time.monotonic() + ANSWER_WAIT, {})
        for peer in range(self.size):
            if peer != self.rank:
                self._sends.append(self.comm.isend(qid, dest=peer, tag=_REQ))

    @property
    def asking(self):
        return self._query is not None

    def answers_ready(self):
        """Return the answers (rank -> progress) once all came or the wait ran out, else None."""
        qid, deadline, answers = self._query
        if len(answers) < self.size - 1 and time.monotonic() < deadline:
            return None
        self._query = None
        return answers

    def cancel(self):
        self._query = None
