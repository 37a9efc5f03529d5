"""Read a trace directory: ``DIR/trace.json`` when it is current, else the per-rank part files.

The format is the recorder's (``docs/trace.md``): part files ``trace.rank<R>.json`` and their
merge ``trace.json`` (Chrome Trace Event Format).  When the merge is missing or older than a
part, comm's ``chainermn_comm.trace.merge(DIR)`` writes it; where that is not available (an
older chainermn-comm) or fails, the parts are read directly, in memory.
"""

import collections
import glob
import json
import os
import re
import warnings

__all__ = ['Trace', 'TraceMissing', 'load', 'MERGED', 'PART_PATTERN']

MERGED = 'trace.json'
PART_PATTERN = re.compile(r'^trace\.rank(\d+)\.json$')
FORMAT = 1


class TraceMissing(Exception):
    """``DIR`` holds no trace the report can read; the message says what is missing."""


#: A loaded trace: ``ranks`` {rank: {'host', 'dropped', 'capacity', 'reason', 'clock_rtt_us'}},
#: ``events`` the complete ("X") events, ``instants`` the instant ("i") events, ``threads``
#: {(rank, tid): name}, ``size`` the job's size, ``source`` what was read.
Trace = collections.namedtuple('Trace', ['source', 'size', 'ranks', 'events', 'instants', 'threads'])


def _read_json(path):
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise TraceMissing('cannot read {}: {}: {}'.format(path, type(e).__name__, e)) from None


def _parts(directory):
    found = {}
    for path in glob.glob(os.path.join(glob.escape(directory), 'trace.rank*.json')):
        m = PART_PATTERN.match(os.path.basename(path))
        if m:
            found[int(m.group(1))] = path
    return dict(sorted(found.items()))


def _split(trace_events, source):
    """Return (complete events, instants, {(rank, tid): thread name}, {rank: host from metadata})."""
    events, instants, threads, hosts = [], [], {}, {}
    for ev in trace_events:
        ph = ev.get('ph')
        if ph == 'X':
            if 'ts' in ev and 'dur' in ev:
                events.append(ev)
        elif ph in ('i', 'I'):
            instants.append(ev)
        elif ph == 'M':
            args = ev.get('args') or {}
            if ev.get('name') == 'thread_name':
                threads[(ev.get('pid'), ev.get('tid'))] = str(args.get('name', ''))
            elif ev.get('name') == 'process_name':
                m = re.match(r'rank \d+ \((.*)\)$', str(args.get('name', '')))
                if m:
                    hosts[ev.get('pid')] = m.group(1)
    if not events:
        raise TraceMissing('{} holds no complete ("ph": "X") events'.format(source))
    return events, instants, threads, hosts


def _check_format(version, source):
    if version is not None and version != FORMAT:
        warnings.warn('{} is chainermn trace format {}; this report reads format {}'.format(
            source, version, FORMAT))


def _from_merged(path):
    doc = _read_json(path)
    if isinstance(doc, list):  # the JSON Array Format of the Trace Event Format
        doc = {'traceEvents': doc}
    if not isinstance(doc, dict) or not isinstance(doc.get('traceEvents'), list):
        raise TraceMissing('{} is not a trace: no "traceEvents" list'.format(path))
    other = doc.get('otherData') or {}
    _check_format(other.get('chainermn_trace'), path)
    events, instants, threads, hosts = _split(doc['traceEvents'], path)
    ranks = {}
    for key, info in (other.get('ranks') or {}).items():
        ranks[int(key)] = {'host': info.get('host'), 'dropped': info.get('dropped', 0),
                           'capacity': info.get('capacity'), 'reason': info.get('reason'),
                           'clock_rtt_us': info.get('clock_rtt_us')}
    for ev in events:
        ranks.setdefault(ev.get('pid'), {'host': None, 'dropped': 0})
    for r, info in ranks.items():
        info['host'] = info.get('host') or hosts.get(r) or '?'
    size = int(other.get('size') or max(ranks) + 1)
    return Trace(path, size, dict(sorted(ranks.items())), events, instants, threads)


def _from_parts(directory, parts):
    """Read the part files directly (the in-memory merge, when comm's merge is unavailable)."""
    events, instants, threads, ranks, sizes = [], [], {}, {}, set()
    for rank, path in parts.items():
        doc = _read_json(path)
        if not isinstance(doc, dict) or not isinstance(doc.get('traceEvents'), list):
            raise TraceMissing('{} is not a trace part: no "traceEvents" list'.format(path))
        _check_format(doc.get('chainermn_trace'), path)
        ev, inst, thr, hosts = _split(doc['traceEvents'], path)
        events += ev
        instants += inst
        threads.update(thr)
        clock = doc.get('clock') or {}
        ranks[rank] = {'host': doc.get('host') or hosts.get(rank) or '?',
                       'dropped': doc.get('dropped', 0), 'capacity': doc.get('capacity'),
                       'reason': doc.get('reason'), 'clock_rtt_us': clock.get('rtt_us')}
        if doc.get('size'):
            sizes.add(int(doc['size']))
    events.sort(key=lambda e: e['ts'])
    size = max(sizes) if sizes else max(ranks) + 1
    source = '{} ({} part file(s))'.format(directory, len(parts))
    return Trace(source, size, ranks, events, instants, threads)


def _merge_with_comm(directory):
    """Let ``chainermn_comm.trace.merge`` write ``DIR/trace.json``; return False where it cannot."""
    try:
        from chainermn_comm.trace import merge
    except ImportError:
        return False
    try:
        merge(directory)
    except Exception as e:  # a broken part must not stop the report: the parts are read directly
        warnings.warn('chainermn_comm.trace.merge({!r}) failed ({}: {}); reading the part files '
                      'directly'.format(directory, type(e).__name__, e))
        return False
    return True


def _current(merged, parts):
    if not os.path.isfile(merged):
        return False
    mtime = os.path.getmtime(merged)
    return all(os.path.getmtime(p) <= mtime for p in parts.values())


def load(path):
    """Return the Trace in ``path`` (a trace directory, its ``trace.json``, or one part file)."""
    if os.path.isfile(path):
        m = PART_PATTERN.match(os.path.basename(path))
        if m:
            return _from_parts(os.path.dirname(path) or '.', {int(m.group(1)): path})
        return _from_merged(path)
    if not os.path.isdir(path):
        raise TraceMissing('{} does not exist: give the directory that CHAINERMN_TRACE named '
                           'for the run'.format(path))
    merged = os.path.join(path, MERGED)
    parts = _parts(path)
    if not parts and not os.path.isfile(merged):
        raise TraceMissing('{} holds no trace: neither {} nor part files trace.rank<R>.json '
                           '(run the job with CHAINERMN_TRACE={} to record one)'.format(
                               path, MERGED, path))
    if parts and not _current(merged, parts) and not (
            _merge_with_comm(path) and _current(merged, parts)):
        return _from_parts(path, parts)
    return _from_merged(merged)
