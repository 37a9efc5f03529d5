"""The texts of the guard: call descriptions, the disagreement error, the stall and watchdog reports."""

from chainermn_comm.guard.side_channel import ANSWER_WAIT

__all__ = ['INVALID_INPUT', 'EXIT_CALL', 'DISAGREEMENT_HINT', 'describe', 'fmt_call', 'short',
           'disagreement_message', 'first_difference', 'format_stall_report', 'watchdog_message']

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
    name, seq, sig, _, info = cur[:5]
    details = 'call #{} {}'.format(seq, fmt_call(name, resolve(sig)))
    if info:
        details += ' [' + ', '.join('{}={}'.format(k, short(v)) for k, v in sorted(info.items())) + ']'
    return details


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


def disagreement_message(rank, what, everyone):
    """Return the error of ranks that disagree on ``what``; ``everyone``: (name, sig, number, host) per rank."""
    lines = []
    for r, (n, s, c, host) in enumerate(everyone):
        call = 'exiting (its program finished or failed)' if n == EXIT_CALL else \
            'collective call #{}: {}'.format(c, fmt_call(n, s))
        lines.append('  rank {}: {} on host {}{}'.format(
            r, call, host, '   <- this rank' if r == rank else ''))
    return 'rank {}: ranks disagree on {}:\n{}\n{}{}'.format(
        rank, what, '\n'.join(lines), first_difference(everyone), DISAGREEMENT_HINT)


def first_difference(everyone):
    """Return a line naming the first sig entry on which two ranks differ, or ''."""
    bad = [(r, dict(e[1])[INVALID_INPUT]) for r, e in enumerate(everyone)
           if INVALID_INPUT in dict(e[1])]
    if bad:
        return 'Invalid input on {}.\n'.format('; '.join('rank {}: {}'.format(r, m) for r, m in bad))
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
                return _params_difference(va, vb, ref_rank, r)
            return 'First difference: {} is {} on rank {} but {} on rank {}.\n'.format(
                key, short(va), ref_rank, short(vb), r)
    return ''


def _params_difference(va, vb, ra, rb):
    for i, (x, y) in enumerate(zip(va, vb)):
        if x != y:
            return 'First difference: parameter {} is {} on rank {} but {} on rank {}.\n'.format(
                i, _fmt_param(x), ra, _fmt_param(y), rb)
    longer, rl, n = (va, ra, len(vb)) if len(va) > len(vb) else (vb, rb, len(va))
    return ('First difference: params has {} arrays on rank {} but {} on rank {}; rank {} also has '
            'parameter {} (does a parameter have no gradient on one rank? use zero_fill=True).\n'.format(
                len(va), ra, len(vb), rb, rl, _fmt_param(longer[n])))


def watchdog_message(rank, size, call, checking, elapsed, timeout, timeout_env, host, last, status):
    """Return the watchdog's report of a call blocked past its timeout (before MPI_Abort(status))."""
    return (
        '*** chainermn watchdog: rank {} of {}: {}{} has been blocked for {:.1f} s '
        '(timeout {:g} s, set by ${} or create_communicator(timeout=...)) on host {}.\n'
        '*** last completed call on this rank: {}\n'
        '*** Another rank probably died, skipped this call or is making a different one. '
        'Stacks of all threads follow; aborting the job with MPI_Abort({}).'.format(
            rank, size, call, checking, elapsed, timeout, timeout_env, host, last, status))


def format_stall_report(rank, size, host, call, elapsed, number, answers, timeout, stall_env,
                        timeout_env, why_no_answers=''):
    """Return the stall report of a rank whose ``call`` (collective ``number``, or 0) has waited."""
    head = ('*** chainermn stall inspector: rank {} of {} (host {}) has waited {:.0f} s in {}; '
            'still waiting'.format(rank, size, host, elapsed, call))
    head += ' (the watchdog ends the job after {:g} s, ${}).'.format(timeout, timeout_env) if timeout > 0 \
        else ' (the watchdog is off, ${}=0).'.format(timeout_env)
    lines = [head]
    if answers is None:
        lines.append('***   cannot ask the other ranks: {}.'.format(why_no_answers))
    else:
        missing, waiting, ahead, silent, others = [], [], [], [], []
        for peer in range(size):
            if peer == rank:
                continue
            a = answers.get(peer)
            if a is None:
                silent.append('rank {}'.format(peer))
                continue
            where = 'rank {} (host {})'.format(peer, a['host'])
            now = 'now in ' + a['call'] if a['call'] else 'now not inside a chainermn call'
            if not number:
                others.append('{}: last entered collective call #{}, {}'.format(
                    where, a['collectives'], now))
            elif a['number'] == number:
                waiting.append(where)
            elif a['collectives'] >= number:
                ahead.append('{}: passed it, last entered collective call #{}, {}'.format(
                    where, a['collectives'], now))
            else:
                missing.append('{}: last entered collective call #{}, {}'.format(
                    where, a['collectives'], now))
        if missing:
            lines.append('***   ranks that have not reached it: ' + '; '.join(missing))
        if others:
            lines.append('***   the other ranks: ' + '; '.join(others))
        if silent:
            lines.append('***   ranks that did not answer within {:g} s (exited, crashed, or holding the '
                         'Python GIL): {}'.format(ANSWER_WAIT, ', '.join(silent)))
        if ahead:
            lines.append('***   ranks already past it: ' + '; '.join(ahead))
        if waiting:
            lines.append('***   ranks waiting in it too: ' + ', '.join(waiting))
    lines.append('***   (reported once per call after ${} seconds; 0 turns the inspector off)'.format(
        stall_env))
    return '\n'.join(lines) + '\n'
