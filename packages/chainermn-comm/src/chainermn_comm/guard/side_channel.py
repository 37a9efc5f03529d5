"""Side channel of the watchdog threads: progress queries, their answers, and exit notices.

A rank's exit notice (``announce``) is answered by every rank it goes to: by that rank's own
notice when it had sent one already (the two ended together), else by an acknowledgement; so
the rank that leaves knows when every message meant for it has come, and none is left over.

Each communicator's guard owns a duplicate of its MPI communicator used only by the watchdog
thread (and, once, by a rank that ends: its exit notice).  Every rank's watchdog thread looks at
it about once a second (one ``Iprobe`` when nothing came): it answers progress queries with a
small reply sent with ``isend``, keeps the other ranks' exit notices (:attr:`SideChannel.departed`)
and the time each rank last answered one of this rank's queries (:attr:`SideChannel.heard`).  A
rank whose call has waited ``$CHAINERMN_STALL_SECONDS`` sends a query to every other rank and
collects the replies for a few seconds.  The collectives themselves carry nothing.  The channel
needs ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it by default); without it the stall report names
only this rank's call and no rank hears of another's exit.

Every message that is not a reply carries the channel's token, drawn by rank 0 when the channel
is made: a notice left unread when a communicator was freed can never be taken for one of a later
communicator that MPI gave the same context.
"""

import itertools
import random
import threading
import time

__all__ = ['SideChannel', 'side_channel_available', 'mpi_lock', 'ANSWER_WAIT']

_REQ = 1
_REP = 2
_BYE = 3
_ACK = 4
#: Seconds a stalled rank waits for the other ranks' answers before it prints its report.
ANSWER_WAIT = 5.0
_query_ids = itertools.count(1)
#: Held by whoever calls MPI on a side channel (the watchdog thread; a rank sending its exit
#: notice); the watchdog takes it for good at program exit (before MPI_Finalize) and when it
#: ends the job.
_MPI_LOCK = threading.Lock()


def mpi_lock():
    """Return the lock held while a side channel is used (see ``_MPI_LOCK``)."""
    return _MPI_LOCK


def side_channel_available():
    """Return (True, '') when the watchdog thread may call MPI, else (False, why not)."""
    from mpi4py import MPI
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        return False, 'MPI was initialised without MPI_THREAD_MULTIPLE (thread level {})'.format(level)
    return True, ''


class SideChannel:
    """Progress queries, answers and exit notices between the watchdog threads of one communicator."""

    def __init__(self, mpi_comm):
        from mpi4py import MPI
        self.comm = mpi_comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.host = MPI.Get_processor_name()
        self.token = self.comm.bcast(random.getrandbits(62) if self.rank == 0 else None, root=0)
        self.served = 0
        #: Exit notices of the ranks that ended: rank -> (notice dict, time.monotonic() it came).
        self.departed = {}
        #: rank -> time.monotonic() of its last answer to one of this rank's queries.
        self.heard = {}
        #: The ranks this rank sent its own exit notice to; those that acknowledged it.
        self.told = set()
        self.acked = set()
        #: When this rank sent its first query of the current stall (None: not asking).
        self.first_asked = None
        self._ask_times = []  # when each query of the current stall was sent
        self._status = MPI.Status()
        self._any_source = MPI.ANY_SOURCE
        self._any_tag = MPI.ANY_TAG
        self._sends = []
        self._qids = set()
        self._query = None  # (query id, deadline, {rank: answer})

    # -- every rank, every tick ---------------------------------------------------------
    def serve(self, progress):
        """Answer pending queries with ``progress()``; take answers to our queries and exit notices."""
        comm, st = self.comm, self._status
        while comm.Iprobe(self._any_source, self._any_tag, st):
            src, tag = st.Get_source(), st.Get_tag()
            msg = comm.recv(source=src, tag=tag)
            if tag == _REQ:
                if msg[0] == self.token:
                    self._sends.append(comm.isend((msg[1], progress()), dest=src, tag=_REP))
                    self.served += 1
            elif tag == _REP:
                qid, answer = msg
                if qid in self._qids:
                    self.heard[src] = time.monotonic()
                    if self._query is not None and qid == self._query[0]:
                        self._query[2][src] = answer
            elif tag == _BYE and isinstance(msg, dict) and msg.get('token') == self.token:
                self.departed.setdefault(src, (msg, time.monotonic()))
                if src not in self.told:  # it waits for an answer: our own notice, or this
                    self._sends.append(comm.isend(self.token, dest=src, tag=_ACK))
            elif tag == _ACK and msg == self.token:
                self.acked.add(src)
        if self._sends:
            self._sends = [r for r in self._sends if not r.Test()]

    # -- a rank that ends -----------------------------------------------------------------
    def announce(self, notice):
        """Send ``notice`` (a dict: this rank ends) to every other rank that has not left; return them."""
        notice = dict(notice, token=self.token)
        self.told = {peer for peer in range(self.size) if peer != self.rank and peer not in self.departed}
        self._sends.extend(self.comm.isend(notice, dest=peer, tag=_BYE) for peer in sorted(self.told))
        return self.told

    def sends_done(self):
        """Return whether every message this rank sent has left (call while serving)."""
        if self._sends:
            self._sends = [r for r in self._sends if not r.Test()]
        return not self._sends

    # -- asking (a stalled rank) ----------------------------------------------------------
    def ask(self):
        """Send a progress query to every other rank that has not left."""
        qid = next(_query_ids) * 4096 + self.rank
        now = time.monotonic()
        self._qids.add(qid)
        self._query = (qid, now + ANSWER_WAIT, {})
        if self.first_asked is None:
            self.first_asked = now
        self._ask_times.append(now)
        for peer in range(self.size):
            if peer != self.rank and peer not in self.departed:  # it takes no more messages
                self._sends.append(self.comm.isend((self.token, qid), dest=peer, tag=_REQ))

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

    def silent_for(self, peer, now):
        """Return the seconds since the oldest query of this stall that ``peer`` has not answered (0: none)."""
        heard = self.heard.get(peer)
        for asked in self._ask_times:
            if heard is None or asked > heard:
                return now - asked
        return 0.0

    def cancel(self):
        """Stop asking: the call that stalled has ended."""
        self._query = None
        self.first_asked = None
        self._ask_times = []
        if len(self._qids) > 1024:
            self._qids.clear()
