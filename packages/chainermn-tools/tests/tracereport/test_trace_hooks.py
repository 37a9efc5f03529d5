"""The report's line per communication hook, on a synthetic trace (trace_synth.py) whose gradient
all-reduces went through a hook that recorded its own compute and all-reduces."""

import sys

import pytest

import trace_synth
from chainermn_tools.trace import report
from chainermn_tools.trace._hooks import hook_lines, hook_stats
from chainermn_tools.trace._text import render

MIB = 2 ** 20


@pytest.fixture(autouse=True)
def no_comm_merge(monkeypatch):
    monkeypatch.setitem(sys.modules, 'chainermn_comm.trace', None)


def _hooked(parts, hook='powersgd-r4'):
    """Name ``hook`` on every gradient all-reduce and add its compute and its own all-reduces inside."""
    for doc in parts.values():
        extra = []
        for ev in doc['traceEvents']:
            args = ev.get('args') or {}
            if ev.get('cat') == 'comm' and args.get('grad'):
                args['hook'] = hook
                ts, rank = ev['ts'], ev['pid']
                for name, cat, start, dur, more in (
                        ('powersgd compress', 'compute', 0, 2000, {}),
                        ('powersgd P', 'comm', 2000, 1000, {'bytes': 1000, 'hook_wire': True}),
                        ('powersgd decompress', 'compute', 3000, 3000, {}),
                        ('powersgd Q', 'comm', 6000, 500, {'bytes': 500, 'hook_wire': True})):
                    extra.append({'name': name, 'cat': cat, 'ph': 'X', 'pid': rank, 'tid': ev['tid'],
                                  'ts': ts + start, 'dur': dur, 'args': dict(more, hook=hook)})
        doc['traceEvents'] = sorted(doc['traceEvents'] + extra, key=lambda e: e.get('ts', 0))
    return parts


def test_hook_line_gives_compute_and_bytes(tmp_path):
    parts = _hooked(trace_synth.make(ranks=2, iterations=10, transfer=8.0, grad_bytes=4 * MIB))
    trace_synth.write_parts(tmp_path, parts)
    rep = report(str(tmp_path))
    (h,) = hook_stats(rep)
    assert h.hook == 'powersgd-r4' and h.iterations == 20
    assert h.grad_bytes == 4 * MIB and h.wire_bytes == 1500
    assert h.compute_ms == pytest.approx(5.0) and h.wire_ms == pytest.approx(1.5)
    assert h.parts == {'powersgd compress': pytest.approx(2.0), 'powersgd decompress': pytest.approx(3.0)}
    (line,) = hook_lines(rep)
    assert line == ('comm hook powersgd-r4: 20 rank-iterations; gradient 4.19 MB per iteration; hook '
                    'compute 5.0 ms (powersgd compress 2.0, powersgd decompress 3.0); its all-reduces '
                    '1.5 ms, 0.0015 MB (0.0% of the gradient) (medians per iteration over all ranks)')
    assert line in render(rep).splitlines()


def test_no_hook_no_line(tmp_path):
    trace_synth.write_parts(tmp_path, trace_synth.make(ranks=2, iterations=5))
    rep = report(str(tmp_path))
    assert hook_lines(rep) == [] and 'comm hook' not in render(rep)
