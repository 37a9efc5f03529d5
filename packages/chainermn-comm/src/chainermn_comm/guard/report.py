"""The texts of the guard: call descriptions, the disagreement error, the stall and watchdog reports."""

import dataclasses

from chainermn_comm.guard.side_channel import ANSWER_WAIT
from chainermn_comm.voice import SUB_COMMUNICATOR, label, who, world

__all__ = ['INVALID_INPUT', 'EXIT_CALL', 'DISAGREEMENT_HINT', 'describe', 'describe_wait', 'fmt_call',
           'short', 'disagreement_message', 'first_difference', 'Stall', 'format_stall_report',
           'watchdog_message', 'unresponsive_line']

#: Signature key of a call whose arguments are invalid on this rank (the value says why).
INVALID_INPUT = 'invalid input'
#: Name a rank reports in the debug-mode check when its program is exiting.
EXIT_CALL = '<program exit>'
_MAX_VALUE_CHARS = 160

#: What usually makes ranks disagree; ends every disagreement error.
DISAGREEMENT_HINT = (
    'Every rank must make the same collective calls in the same order with the same shapes, '
    'dtypes, parameters and roots. Common causes: different batch sizes on different ranks (e.g. '
    'a dataset not split evenly, or the last batch of an epoch); an extension registered on one '
    'rank only (e.g. trainer.extend(snapshot or evaluator) under `if comm.rank == 0`: register '
    'extensions that communicate on every rank); a snapshot loaded on one rank only (resume every '
    'rank from a multi-node snapshot or the checkpointer); a model built differently on one rank; '
    'a parameter without a gradient on one rank; or one rank running an extra iteration.')


def short(value):
    """Return ``str(value)``, cut to a readable length."""
    text = str(value)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[:_MAX_VALUE_CHARS - 20] + '...<{} chars>'.format(len(text))
    return text


def resolve(sig):
    """Return ``sig``, calling it first when it is given lazily (a callable)."""
    return sig() if callable(sig) else sig


def fmt_call(name, sig):
    """Return ``name(key=value, ...)`` for a call and its signature."""
    if not sig:
        return '{}()'.format(name)
    return '{}({})'.format(name, ', '.join('{}={}'.format(k, _fmt_value(k, v)) for k, v in sig))


def describe(cur):
    """Return a one-line description of the call ``cur``: name, sequence number, sig and info."""
    info = cur.info
    details = 'call #{} {}'.format(cur.seq, fmt_call(cur.name, resolve(cur.sig)))
    if info:
        details += ' [' + ', '.join('{}={}'.format(k, short(v)) for k, v in sorted(info.items())) + ']'
    return details


def describe_wait(cur):
    """Return the call ``cur`` as the ranks number it: 'collective call #N name(...)' or 'call #S ...'."""
    if cur.number:
        return 'collective call #{} {}'.format(cur.number, fmt_call(cur.name, resolve(cur.sig)))
    return describe(cur)


def _fmt_value(key, value):
    if key == INVALID_INPUT:
        return '<see below>'
    if key == 'params' and isinstance(value, tuple):
        return '<{} arrays>'.format(len(value))
    return short(value)


def _fmt_param(entry):
    """Describe one entry of a ``params`` signature: (name, shape, dtype) or (shape, dtype)."""
    if len(entry) == 3:
        return "'{}' with shape {} dtype {}".format(entry[0], entry[1], entry[2])
    return 'shape {} dtype {}'.format(entry[0], entry[1])


def disagreement_message(rank, what, everyone, world_of=None):
    """Return the error of ranks that disagree on ``what``; ``everyone``: (name, sig, number, host) per rank.

    When every rank makes the same call and some rank's input is invalid there, the error says
    that instead: the call fails on every rank because of that input.  Ranks are named by
    :func:`label` (``world_of``: see :func:`world`).
    """
    invalid = _invalid_only(everyone)
    if invalid:
        name, number = everyone[0][0], everyone[0][2]
        bad = ', '.join(who(r, everyone[r][3], world_of) for r, _ in invalid)
        return '{}: collective call #{} {} fails on every rank because of invalid input on {}.\n{}'.format(
            label(rank, world_of), number, name, bad, first_difference(everyone, world_of))
    lines = []
    for r, (n, s, c, host) in enumerate(everyone):
        call = 'exiting (its program finished or failed)' if n == EXIT_CALL else \
            'collective call #{}: {}'.format(c, fmt_call(n, s))
        lines.append('  {}: {} on host {}{}'.format(
            label(r, world_of), call, host, '   <- this rank' if r == rank else ''))
    return '{}: ranks disagree on {}:\n{}\n{}{}'.format(
        label(rank, world_of), what, '\n'.join(lines), first_difference(everyone, world_of),
        DISAGREEMENT_HINT)


def _invalid_only(everyone):
    """Return [(rank, message)] of the ranks with invalid input when every rank makes the same call."""
    if len({(e[0], e[2]) for e in everyone}) != 1 or everyone[0][0] == EXIT_CALL:
        return []
    return [(r, dict(e[1])[INVALID_INPUT]) for r, e in enumerate(everyone) if INVALID_INPUT in dict(e[1])]


def first_difference(everyone, world_of=None):
    """Return a line naming the first sig entry on which two ranks differ, or ''."""
    bad = [(r, dict(e[1])[INVALID_INPUT]) for r, e in enumerate(everyone)
           if INVALID_INPUT in dict(e[1])]
    if bad:
        text = '; '.join('{}: {}'.format(label(r, world_of), m) for r, m in bad)
        return 'Invalid input on {}{}\n'.format(text, '' if text.endswith('.') else '.')
    ref_rank, (ref_name, ref_sig) = 0, everyone[0][:2]
    for r, entry in enumerate(everyone):
        name, sig = entry[:2]
        if name != ref_name:
            continue
        a, b = dict(ref_sig), dict(sig)
        for key in list(a) + [k for k in b if k not in a]:
            va, vb = a.get(key), b.get(key)
            if va == vb:
                continue
            if isinstance(va, tuple) and isinstance(vb, tuple) and key == 'params':
                return _params_difference(va, vb, ref_rank, r, world_of)
            return 'First difference: {} is {} on {} but {} on {}.\n'.format(
                key, short(va), label(ref_rank, world_of), short(vb), label(r, world_of))
    return ''


def _params_difference(va, vb, ra, rb, world_of=None):
    la, lb = label(ra, world_of), label(rb, world_of)
    for i, (x, y) in enumerate(zip(va, vb)):
        if x != y:
            return 'First difference: parameter {} is {} on {} but {} on {}.\n'.format(
                i, _fmt_param(x), la, _fmt_param(y), lb)
    longer, ll, n = (va, la, len(vb)) if len(va) > len(vb) else (vb, lb, len(va))
    return ('First difference: params has {} arrays on {} but {} on {}; {} also has '
            'parameter {} (does a parameter have no gradient on one rank? use zero_fill=True).\n'.format(
                len(va), la, len(vb), lb, ll, _fmt_param(longer[n])))


def _of(rank, size, world_of):
    """Return 'rank R of N', or on a sub-communicator 'rank W (rank R of N of the split communicator)'."""
    if world_of is None:
        return 'rank {} of {}'.format(rank, size)
    return 'rank {} (rank {} of {} of {})'.format(world(rank, world_of), rank, size, SUB_COMMUNICATOR)


def watchdog_message(rank, size, call, checking, elapsed, timeout, timeout_env, host, last, status,
                     world_of=None):
    """Return the watchdog's report of a call blocked past its timeout (before MPI_Abort(status))."""
    return (
        '*** chainermn watchdog: {}: {}{} has been blocked for {:.1f} s '
        '(timeout {:g} s, set by ${} or create_communicator(timeout=...)) on host {}.\n'
        '*** last completed call on this rank: {}\n'
        '*** Another rank probably died, skipped this call or is making a different one. '
        'The stacks of all threads of this rank follow; then this rank ends the whole job with '
        'MPI_Abort({}) (exit status {}).'.format(
            _of(rank, size, world_of), call, checking, elapsed, timeout, timeout_env, host, last,
            status, status))


def unresponsive_line(rank, host, peer, peer_host, silent, call, last_answer, env, status,
                      world_of=None):
    """Return the one line of a rank that ends the job because rank ``peer`` stopped answering."""
    seen = '; its last answer: {}'.format(last_answer) if last_answer else '; it never answered'
    return ('chainermn: {} has not answered the stall inspector for {:.0f} s (${}): '
            'it is frozen, stopped, or holds the Python GIL{}; {} waits in {}: '
            'ending the job with MPI_Abort({})'.format(who(peer, peer_host or '?', world_of), silent,
                                                     env, seen, who(rank, host, world_of), call,
                                                     status))


def _where(peer, a, world_of=None):
    return who(peer, a['host'], world_of)


def _now(a):
    return 'now in ' + a['call'] if a['call'] else 'now not inside a chainermn call'


@dataclasses.dataclass
class Stall:
    """What a stall report shows: rank ``rank`` of ``size`` (host ``host``) has waited ``elapsed``
    seconds in ``call`` (described), its collective ``number`` (0: point-to-point).

    ``answers``: rank -> progress of the ranks that answered (None: no side channel, because
    ``why_no_answers``); ``departed``: rank -> exit notice of the ranks that ended; ``timeout``
    and ``unresponsive``: the watchdog's limits (0: off), set by ``timeout_env`` and
    ``unresponsive_env``; ``stall_env`` sets the threshold.
    """

    rank: int
    size: int
    host: str
    call: str
    elapsed: float
    number: int
    answers: object
    timeout: float
    stall_env: str = 'CHAINERMN_STALL_SECONDS'
    timeout_env: str = 'CHAINERMN_TIMEOUT'
    why_no_answers: str = ''
    departed: object = None
    unresponsive: float = 0.0
    unresponsive_env: str = 'CHAINERMN_UNRESPONSIVE_SECONDS'
    #: The world rank of each rank of the communicator (None: it is the whole job's); see :func:`world`.
    world_of: object = None


def format_stall_report(stall):
    """Return the stall report of :class:`Stall` ``stall``; it ends with what to do."""
    rank, size, host, number, answers = stall.rank, stall.size, stall.host, stall.number, stall.answers
    timeout, timeout_env, departed = stall.timeout, stall.timeout_env, stall.departed
    world_of = stall.world_of
    me = '{} (host {})'.format(_of(rank, size, None), host) if world_of is None else \
        'rank {} (rank {} of {} of {}, host {})'.format(world(rank, world_of), rank, size,
                                                      SUB_COMMUNICATOR, host)
    head = ('*** chainermn stall inspector: {} has waited {:.0f} s in {}; '
            'still waiting'.format(me, stall.elapsed, stall.call))
    head += (' (the watchdog ends the job with exit status 14 once this call has waited {:g} s, '
             '${}).'.format(timeout, timeout_env) if timeout > 0
             else ' (the watchdog is off, ${}=0).'.format(timeout_env))
    lines = [head]
    missing_ranks, silent = [], []
    if answers is None:
        lines.append('***   cannot ask the other ranks: {}.'.format(stall.why_no_answers))
    else:
        missing, waiting, ahead, others, gone = [], [], [], [], []
        for peer in range(size):
            if peer == rank:
                continue
            a = answers.get(peer)
            if departed and peer in departed:
                n = departed[peer]
                gone.append('{} {} at collective call #{}'.format(
                    who(peer, n['host'], world_of), n['why'], n['collectives']))
            elif a is None:
                silent.append(peer)
            elif not number:
                others.append('{}: last entered collective call #{}, {}'.format(
                    _where(peer, a, world_of), a['collectives'], _now(a)))
            elif a['number'] == number:
                waiting.append(_where(peer, a, world_of))
            elif a['collectives'] >= number:
                ahead.append('{}: passed it, last entered collective call #{}, {}'.format(
                    _where(peer, a, world_of), a['collectives'], _now(a)))
            else:
                missing.append('{}: last entered collective call #{}, {}'.format(
                    _where(peer, a, world_of), a['collectives'], _now(a)))
                missing_ranks.append((peer, a))
        if missing:
            lines.append('***   ranks that have not reached it: ' + '; '.join(missing))
        if others:
            lines.append('***   the other ranks: ' + '; '.join(others))
        if silent:
            lines.append('***   ranks that did not answer within {:g} s (exited, crashed, frozen, or '
                         'holding the Python GIL): {}'.format(
                             ANSWER_WAIT, ', '.join(label(p, world_of) for p in silent)))
        if gone:
            lines.append('***   ranks that ended: ' + '; '.join(gone))
        if ahead:
            lines.append('***   ranks already past it: ' + '; '.join(ahead))
        if waiting:
            lines.append('***   ranks waiting in it too: ' + ', '.join(waiting))
    lines.extend(_advice(missing_ranks, silent, timeout, timeout_env, stall.unresponsive,
                         stall.unresponsive_env, world_of))
    lines.append('***   (reported once per call after ${} seconds; 0 turns the inspector off)'.format(
        stall.stall_env))
    return '\n'.join(lines) + '\n'


def _advice(missing, silent, timeout, timeout_env, unresponsive, unresponsive_env, world_of=None):
    """Return the report's 'what to do' lines."""
    lines = []
    for peer, a in missing:
        pid = ' (pid {})'.format(a['pid']) if a.get('pid') else ''
        lines.append('***   what to do: {} answered, so it is alive{}: if it is only slow (an '
                     'evaluation, checkpoint or data loading on that rank alone) the job goes on '
                     'when it arrives; if it skipped this call or makes another one, make every '
                     'rank make the same collective calls. See where it is: py-spy dump --pid {} '
                     'on host {}.'.format(label(peer, world_of), pid, a.get('pid', 'PID'), a['host']))
    for peer in silent:
        when = ('if it stays silent for {:g} s (${}) this job ends'.format(unresponsive, unresponsive_env)
                if unresponsive > 0 else 'nothing ends this job before the watchdog (${}=0)'.format(
                    unresponsive_env))
        lines.append('***   what to do: {} does not answer (frozen, stopped, killed, or its '
                     'Python holds the GIL): {}; look at that process on its host.'.format(
                         label(peer, world_of), when))
    switches = []
    if timeout > 0:
        switches.append('${}={:g} ends any call that waits that long'.format(timeout_env, timeout))
    else:
        switches.append('${} (seconds) ends any call that waits that long'.format(timeout_env))
    if unresponsive > 0:
        switches.append('${}={:g} ends a job whose rank stops answering'.format(
            unresponsive_env, unresponsive))
    switches.append('chainermn.global_except_hook.add_hook() (or CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1) '
                    'ends the job when a rank raises')
    lines.append('***   to end such a job sooner: ' + '; '.join(switches) + '.')
    return lines
