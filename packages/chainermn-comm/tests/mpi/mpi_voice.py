"""One voice at N ranks (run on every rank by test_voice_mpi.py): warnings once, errors agreed."""

import warnings

import numpy
import pytest
from mpi4py import MPI

import chainermn_comm
from chainermn_comm import _gpu_support, settings, voice

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
LAST = SIZE - 1


def _create(**kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        try:
            return chainermn_comm.create_communicator(**kwargs), caught, None
        except Exception as e:
            return None, caught, e


@pytest.mark.skipif(_gpu_support.gpu_available(), reason='a GPU is available here')
def test_default_on_cpus_is_quiet_and_errors_on_every_rank(monkeypatch):
    # The documented default (issue 54): no name, or None (an argparse default), is naive on CPUs.
    for kwargs in ({}, {'communicator_name': None}):
        comm, caught, error = _create(**kwargs)
        assert error is None and isinstance(comm, chainermn_comm.NaiveCommunicator)
        assert [str(w.message) for w in caught] == []
    # A warning of the set-up under an 'error' filter is an error on every rank, at the same point.
    monkeypatch.setenv('CHAINERMN_TIMOUT', '5')
    with warnings.catch_warnings():
        warnings.simplefilter('error', settings.UnknownVariableWarning)
        with pytest.raises(settings.UnknownVariableWarning) as e:
            chainermn_comm.create_communicator()
    assert voice.reporter_of(e.value) == 0


def test_unknown_variable_on_one_rank_is_named_once(monkeypatch):
    if RANK == LAST:
        monkeypatch.setenv('CHAINERMN_TIMOUT', '5')
    comm, caught, error = _create(communicator_name='naive')
    assert error is None
    got = [str(w.message) for w in caught if 'CHAINERMN_TIMOUT' in str(w.message)]
    if RANK != 0:
        assert got == [], got
        return
    assert len(got) == 1, got
    assert 'Did you mean CHAINERMN_TIMEOUT?' in got[0], got[0]
    assert got[0].endswith('' if SIZE == 1 else ' (rank {})'.format(LAST)), got[0]


def test_bad_setting_on_one_rank_fails_every_rank(monkeypatch):
    if RANK == LAST:
        monkeypatch.setenv('CHAINERMN_TIMEOUT', 'soon')
    comm, caught, error = _create(communicator_name='naive')
    assert isinstance(error, ValueError), error
    assert voice.reporter_of(error) == 0
    text = str(error)
    assert 'CHAINERMN_TIMEOUT' in text, text
    if SIZE > 1:
        assert 'create_communicator failed on 1 of {} rank(s), so it fails on every rank. rank {}: ' \
               'ValueError: '.format(SIZE, LAST) in text, text


def test_unknown_name_is_agreed():
    comm, caught, error = _create(communicator_name='hierachical')
    assert isinstance(error, ValueError) and 'hierarchical' in str(error), error
    assert voice.reporter_of(error) == 0
    assert voice.decide(error) == ('report' if RANK == 0 else 'pointer')


@pytest.mark.skipif(SIZE == 1, reason='one rank always agrees')
def test_disagreement_is_agreed_and_reported_by_the_communicator_s_rank_0():
    comm = chainermn_comm.create_communicator('naive')
    with pytest.raises(chainermn_comm.CommunicationError) as e:
        comm.allreduce(numpy.ones(2 if comm.rank == 0 else 3))
    assert voice.reporter_of(e.value) == 0
    assert voice.decide(e.value) == ('report' if RANK == 0 else 'pointer')
    # On a communicator of the ranks above 0, its own rank 0 (world rank 1) reports.
    sub = comm.split(int(RANK == 0), RANK)
    if RANK != 0 and sub.size > 1:
        with pytest.raises(chainermn_comm.CommunicationError) as e:
            sub.allreduce(numpy.ones(2 if sub.rank == 0 else 3))
        assert voice.reporter_of(e.value) == 1
        assert voice.decide(e.value) == ('report' if RANK == 1 else 'pointer')
    comm.mpi_comm.Barrier()


@pytest.mark.skipif(SIZE == 1, reason='one rank always agrees')
def test_one_rank_s_invalid_input_is_agreed_on_every_rank():
    comm = chainermn_comm.create_communicator('naive')
    with pytest.raises(chainermn_comm.CommunicationError) as e:
        comm.bcast_obj('x', root=7 if RANK == LAST else 0)
    assert voice.reporter_of(e.value) == 0
