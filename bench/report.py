"""Merge the 'ours' and 'peer' benchmark JSONs, add ratios against the targets, print a table."""

import json
import os
import sys

__all__ = ['merge', 'main', 'save']

OURS = 'ours_naive_multi_node_mean_grad'
OURS_MPI_ONLY = 'ours_naive_mpi_only_multi_node_mean_grad'
PEER = 'peer_chainer781_naive_mean_grad'


def save(result, path):
    """Note the load average after the run in ``result['meta']``; write ``result`` to ``path`` if given."""
    result['meta']['loadavg_after'] = os.getloadavg()
    if path:
        with open(path, 'w') as f:
            json.dump(result, f, indent=1)
    return result


def _med(entry, name):
    c = entry['contenders'].get(name)
    return c['median_s'] if c else None


def _ratio(a, b):
    return a / b if a and b else None


def merge(ours, peer):
    """Return one result: ours with the peer job's contenders (prefixed peerjob_) and ratios."""
    out = {'meta': {'ours': ours['meta'], 'peer': peer['meta'] if peer else None}, 'models': {}}
    for model, entry in ours['models'].items():
        e = dict(entry)
        e['contenders'] = dict(entry['contenders'])
        pe = peer['models'].get(model) if peer else None
        if pe:
            for name, c in pe['contenders'].items():
                e['contenders'][name if name.startswith('peer_') else 'peerjob_' + name] = c
        m = lambda n: _med(e, n)  # noqa: E731
        r = {
            'ours_over_floor_chunked (target <= 1.15)': _ratio(m(OURS), m('floor_packed_chunked')),
            'per_array_over_ours (target >= 1.4)': _ratio(m('per_array_allreduce'), m(OURS)),
            'per_array_mean_over_ours': _ratio(m('per_array_allreduce_mean'), m(OURS)),
            'ours_over_floor_one': _ratio(m(OURS), m('floor_packed_one')),
            'floor_one_over_floor_chunked': _ratio(m('floor_packed_one'), m('floor_packed_chunked')),
            'ours_over_memcopy': _ratio(m(OURS), m('memcopy_once')),
            'ours_mpi_only_over_ours': _ratio(m(OURS_MPI_ONLY), m(OURS)),
        }
        if pe:
            # The peer ran in its own job: compare it with ours both directly and each
            # normalised by the chunked floor measured in its own job.
            r['peer_over_ours'] = _ratio(m(PEER), m(OURS))
            r['peer_over_its_job_floor_chunked'] = _ratio(m(PEER), m('peerjob_floor_packed_chunked'))
            r['peer_norm_over_ours_norm'] = _ratio(r['peer_over_its_job_floor_chunked'],
                                                   r['ours_over_floor_chunked (target <= 1.15)'])
        e['ratios'] = r
        out['models'][model] = e
    return out


def _state(job, meta):
    """Return the line describing one job's cross-core read probe (see probe.py), or None."""
    probes = [(when, (meta or {}).get('cross_core_read_' + when)) for when in ('before', 'after')]
    probes = [(when, p) for when, p in probes if p]
    if not probes:
        return None
    return 'machine state: reading {} KiB another core just wrote: {} ({} job)'.format(
        probes[0][1]['bytes'] // 1024, '; '.join(
            '{} {:.0f} us vs {:.0f} us local (x{:.2f})'.format(when, p['hot_us'], p['local_us'], p['ratio'])
            for when, p in probes), job)


def _fmt(result):
    lines = [line for line in (_state(job, result['meta'].get(job)) for job in ('ours', 'peer')) if line]
    if lines:
        lines.append('  (x1.0-1.3: the usual state; x1.5 and more: the slow cross-core state, '
                     'in which the shared-memory average runs ~1.5x the MPI floor)')
    for model, e in result['models'].items():
        lines.append('== {}: {} arrays, {:.1f} MB'.format(model, e['arrays'], e['bytes'] / 1e6))
        lines.append('  {:<40s} {:>10s} {:>10s} {:>9s} {:>9s}'.format(
            'contender', 'median ms', 'min ms', 'algbw GB/s', 'busbw GB/s'))
        for name, c in sorted(e['contenders'].items(), key=lambda kv: kv[1]['median_s']):
            lines.append('  {:<40s} {:>10.2f} {:>10.2f} {:>9.2f} {:>9.2f}'.format(
                name, c['median_s'] * 1e3, c['min_s'] * 1e3, c['algbw_GBps'], c['busbw_GBps']))
        for k, v in e['ratios'].items():
            lines.append('  {:<52s} {}'.format(k, '-' if v is None else '{:.3f}'.format(v)))
    return '\n'.join(lines)


def main(argv):
    ours = json.load(open(argv[1]))
    peer = json.load(open(argv[2])) if len(argv) > 2 and argv[2] != '-' else None
    result = merge(ours, peer)
    with open(argv[3] if len(argv) > 3 else argv[1], 'w') as f:
        json.dump(result, f, indent=1)
    print(_fmt(result))


if __name__ == '__main__':
    main(sys.argv)
