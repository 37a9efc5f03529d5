"""Every rank of a communicator sets alike what changes what it sends; checked when it is made.

Some settings change which messages a rank sends: ``CHAINERMN_DEBUG`` (a full signature exchange
before each collective), ``CHAINERMN_CHECK``, ``CHAINERMN_TUNE``, the chunk, bucket and in-place
sizes, ``CHAINERMN_SHM_REDUCE``, ``CHAINERMN_EXIT_NOTICE``, ... (``protocol.AGREED_VARIABLES``)
and the wire dtype (``create_communicator(allreduce_grad_dtype=...)``).  Ranks that differ would
sit in different calls forever or fail with MPI's own message.  So ``create_communicator`` calls
:func:`agree` before anything that depends on them: one plain ``allgather`` of a small dict,
which works whatever the settings are; a difference raises ``ValueError`` on every rank
together (rank 0 reports it), naming each variable, the ranks and their values.
"""

from chainermn_comm import settings, threads, voice
from chainermn_comm.protocol import AGREED_VARIABLES, VARIABLES

__all__ = ['WIRE', 'values', 'differences', 'agree']

#: The key of the wire dtype among the values (not a variable: an argument).
WIRE = 'allreduce_grad_dtype'


def _wire(dtype):
    from chainermn_comm.reduce.dtypes import validate_grad_dtype
    try:
        valid = validate_grad_dtype(dtype)
    except (TypeError, ValueError):   # said by the communicator's own check, on every rank
        return 'invalid {!r}'.format(dtype)
    return None if valid is None else str(valid)


def values(allreduce_grad_dtype=None, environ=None):
    """Return this rank's ``{name: (value compared, text shown)}`` of every agreed setting.

    Values are parsed (``1`` and ``yes`` agree); an unset size variable differs from a set one
    (setting it pins the tuner's knob), and so does an unset ``CHAINERMN_SHM_REDUCE`` from a set
    one (``agreed='exact'``); a directory variable (``CHAINERMN_TRACE``) is compared by whether it
    is set (``agreed='set'``).
    """
    out = {}
    for name in AGREED_VARIABLES:
        var = VARIABLES[name]
        given = settings.is_set(name, environ=environ)
        if var.agreed == 'set':
            out[name] = (given, 'set' if given else 'unset')
            continue
        value = settings.read(name, environ=environ)
        if given:
            shown = _text(value)
        elif var.default in (None, ''):
            shown = 'unset'
        else:
            shown = 'unset (default {})'.format(_text(var.default))
        out[name] = ((given, value) if var.agreed == 'exact' else value, shown)
    wire = _wire(allreduce_grad_dtype)
    out[WIRE] = (wire, 'None' if wire is None else wire)
    return out


def _text(value):
    if value is True:
        return '1'
    if value is False:
        return '0'
    return str(value)


def _ranks(ranks):
    if len(ranks) == 1:
        return 'rank {}'.format(ranks[0])
    return 'ranks ' + threads.spans(ranks)


def differences(everyone):
    """Return one line per setting on which the ranks' :func:`values` differ (empty: they agree)."""
    lines = []
    for name in everyone[0]:
        groups = {}
        for rank, mine in enumerate(everyone):
            value, shown = mine.get(name, (None, 'unknown'))
            groups.setdefault(repr(value), (shown, []))[1].append(rank)
        if len(groups) > 1:
            said = '; '.join('{} on {}'.format(shown, _ranks(ranks)) for shown, ranks in groups.values())
            what = name if name != WIRE else 'create_communicator(allreduce_grad_dtype=...)'
            lines.append('{}: {}'.format(what, said))
    return lines


def agree(mpi_comm, allreduce_grad_dtype=None):
    """Check that every rank of ``mpi_comm`` has the same agreed settings; else raise ValueError on every rank.

    Collective over ``mpi_comm`` (one ``allgather``); call it on every rank before anything that
    depends on the settings.
    """
    lines = differences(mpi_comm.allgather(values(allreduce_grad_dtype)))
    if not lines:
        return
    world = ''
    try:
        from mpi4py import MPI
        if mpi_comm.Get_size() != MPI.COMM_WORLD.Get_size():
            world = ' (ranks of the communicator being made)'
    except Exception:
        pass
    wire = any(line.startswith('create_communicator(') for line in lines)
    raise voice.agreed(ValueError(
        'the ranks differ in settings that change what they send{}:\n  {}\nEvery rank must have the '
        'same value: set each variable alike on every rank (mpiexec -genv NAME VALUE, or export it '
        'before mpiexec), or on none{}.'.format(
            world, '\n  '.join(lines), '; pass the same allreduce_grad_dtype on every rank' if wire
            else '')), mpi_comm)
