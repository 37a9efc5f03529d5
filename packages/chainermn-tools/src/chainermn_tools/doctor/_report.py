"""Rows of the doctor's report and the table they are printed in."""

import collections

__all__ = ['Row', 'OK', 'WARN', 'FAIL', 'INFO', 'SKIP', 'ranges', 'render', 'summary']

OK, WARN, FAIL, INFO, SKIP = 'OK', 'WARN', 'FAIL', 'INFO', 'SKIP'

#: One check: its name, status, what was found, and what to do when it is not OK.
Row = collections.namedtuple('Row', ['check', 'status', 'detail', 'fix'])
Row.__new__.__defaults__ = ('',)


def ranges(ranks):
    """Format ints as '0-3,6'."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(str(start) if start == prev else '{}-{}'.format(start, prev))
            start = prev = r
    if start is not None:
        out.append(str(start) if start == prev else '{}-{}'.format(start, prev))
    return ','.join(out)


def _wrap(text, width):
    lines = []
    for para in str(text).splitlines() or ['']:
        while len(para) > width:
            cut = para.rfind(' ', 0, width)
            cut = width if cut <= 0 else cut
            lines.append(para[:cut])
            para = para[cut:].lstrip()
        lines.append(para)
    return lines


def render(rows, width=100):
    """Return the report table followed by a numbered 'what to do' list for WARN/FAIL rows."""
    name_w = max([len('CHECK')] + [len(r.check) for r in rows])
    detail_w = max(30, width - name_w - 12)
    out = ['{:<{w}}  {:<8}  {}'.format('CHECK', 'STATUS', 'DETAIL', w=name_w),
           '{}  {}  {}'.format('-' * name_w, '-' * 8, '-' * detail_w)]
    fixes = []
    for r in rows:
        detail = _wrap(r.detail, detail_w)
        mark = r.status
        if r.status in (WARN, FAIL) and r.fix:
            fixes.append(r)
            mark = '{} [{}]'.format(r.status, len(fixes))
        out.append('{:<{w}}  {:<8}  {}'.format(r.check, mark, detail[0], w=name_w))
        out.extend('{:<{w}}  {:<8}  {}'.format('', '', d, w=name_w) for d in detail[1:])
    if fixes:
        out += ['', 'What to do:']
        for i, r in enumerate(fixes, 1):
            head = '  [{}] {} ({}): '.format(i, r.check, r.status)
            lines = _wrap(head + r.fix, width - 6)
            out.append(lines[0])
            out.extend('      ' + ln for ln in lines[1:])
    return '\n'.join(out)


def summary(rows):
    """Return (one-line verdict, exit status): non-zero when any row FAILed."""
    fails = sum(r.status == FAIL for r in rows)
    warns = sum(r.status == WARN for r in rows)
    verdict = 'chainermn doctor: {} checks, {} failed, {} warnings -> {}'.format(
        len(rows), fails, warns, 'BROKEN' if fails else 'OK')
    return verdict, (1 if fails else 0)
