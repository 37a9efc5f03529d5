"""The doctor's view of the node: cores, ranks per node, each rank's affinity and thread pools."""

from chainermn_comm import threads

from chainermn_tools.doctor._report import INFO, OK, WARN, Row
from chainermn_tools.doctor._report import ranges as _ranges

__all__ = ['cpu_facts', 'cpu_rows', 'BIND_FIX']

#: How to start ranks on disjoint cores, with each launcher.
BIND_FIX = ('start at most as many ranks per node as it has cores, each bound to its own cores: '
            '`mpiexec -bind-to core` (MPICH/Hydra, Intel MPI), `mpirun --bind-to core` (Open MPI), '
            '`srun --cpu-bind=cores` (Slurm); `python -m chainermn launch` and `cluster` bind where '
            'the cores suffice. See docs/communicators.md, "Ranks, cores and threads"')


def cpu_facts():
    """Return this rank's CPUs, thread pools and what decided them (picklable)."""
    choice = threads.current()
    return {'facts': threads.local_facts(), 'pools': threads.pools(),
            'choice': None if choice is None else tuple(choice)}


def _n(count, word):
    return '{} {}{}'.format(count, word, '' if count == 1 else 's')


def _group(items):
    """Return [(description, ranks)] for {rank: description}, in rank order of first appearance."""
    out = {}
    for rank, text in sorted(items.items()):
        out.setdefault(text, []).append(rank)
    return [(text, ranks) for text, ranks in out.items()]


def _pools_text(pools, choice):
    counts = {}
    for pool in pools:
        counts[tuple(pool)] = counts.get(tuple(pool), 0) + 1
    libs = ', '.join('{}{} {} thread{} ({})'.format('{} x '.format(k) if k > 1 else '', lib, n,
                                                    '' if n == 1 else 's', layer)
                     for (lib, layer, n), k in counts.items()) or 'no BLAS or OpenMP library loaded'
    if choice is None:
        return libs
    chosen = threads.ThreadChoice(*choice)
    if chosen.source == 'rule':
        why = 'set by chainermn: {} for {}'.format(_n(chosen.cpus, 'CPU'), _n(chosen.sharing, 'rank'))
    elif chosen.threads:
        why = 'set by {}={}'.format(chosen.source, chosen.threads)
    else:
        why = 'left as {} sets them'.format(chosen.source)
    return '{}; {}'.format(libs, why)


def cpu_rows(gathered):
    """Return the rows 'cores / ranks', 'rank affinity' and 'thread pools' from every rank's cpu_facts()."""
    facts = [g['facts'] for g in gathered]
    machines = {}
    for rank, f in enumerate(facts):
        machines.setdefault(f.machine, []).append(rank)
    parts = []
    for ranks in machines.values():
        union = 0
        for r in ranks:
            union |= facts[r].mask
        quota = facts[ranks[0]].quota
        parts.append('{}: {} ({}{}), {} ({})'.format(
            '/'.join(dict.fromkeys(facts[r].host for r in ranks)), _n(bin(union).count('1'), 'CPU'),
            threads.cpu_list(union), '' if quota is None else '; cgroup quota {}'.format(quota),
            _n(len(ranks), 'rank'), _ranges(ranks)))
    problems = threads.oversubscription(facts)
    rows = [Row('cores / ranks', WARN if problems else OK,
                '; '.join(parts) + ('; oversubscribed: ' + '; '.join(problems) if problems else ''),
                BIND_FIX)]
    affinity = _group({r: 'CPUs {}'.format(threads.cpu_list(f.mask)) for r, f in enumerate(facts)})
    rows.append(Row('rank affinity', INFO, '; '.join('rank{} {}: {}'.format(
        's' if len(rs) > 1 else '', _ranges(rs), text) for text, rs in affinity)))
    pools = _group({r: _pools_text(g['pools'], g['choice']) for r, g in enumerate(gathered)})
    rows.append(Row('thread pools', INFO, '; '.join('rank{} {}: {}'.format(
        's' if len(rs) > 1 else '', _ranges(rs), text) for text, rs in pools)))
    return rows
