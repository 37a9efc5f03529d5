"""docs/environment.md lists every variable protocol declares, the user's knobs apart from chainermn's own."""

import os
import re

from chainermn_comm import protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERNAL_HEADING = '## Set by chainermn, or for tests and simulation'


def _names(text):
    """Return the variables named in the first column of the table rows of ``text``."""
    names = []
    for line in text.splitlines():
        if line.startswith('| `CHAINERMN_'):
            names += re.findall(r'`(CHAINERMN_[A-Z_]+)`', line.split(' | ')[0])
    return names


def test_the_users_knobs_and_chainermns_own_variables_are_listed_apart():
    with open(os.path.join(ROOT, 'docs', 'environment.md'), encoding='utf-8') as f:
        text = f.read()
    users, internal = text.split(INTERNAL_HEADING)
    assert sorted(_names(users)) == sorted(protocol.USER_VARIABLES)
    assert sorted(_names(internal)) == sorted(protocol.INTERNAL_VARIABLES)


def test_the_tables_are_apart_and_the_parser_reads_both():
    assert not set(protocol.USER_VARIABLES) & set(protocol.INTERNAL_VARIABLES)
    assert list(protocol.VARIABLES) == list(protocol.USER_VARIABLES) + list(protocol.INTERNAL_VARIABLES)
    assert all(v.internal for v in protocol.INTERNAL_VARIABLES.values())
    assert not any(v.internal for v in protocol.USER_VARIABLES.values())
    assert {'CHAINERMN_THREADS_CHOSEN', 'CHAINERMN_RANKS_PER_NODE', 'CHAINERMN_NODE_LOCAL',
            'CHAINERMN_LAUNCH_PROGRESS'} <= set(protocol.INTERNAL_VARIABLES)


def test_the_process_wide_effects_are_the_table_of_docs_process_md():
    from chainermn_comm import process
    with open(os.path.join(ROOT, 'docs', 'process.md'), encoding='utf-8') as f:
        rows = [line for line in f.read().splitlines() if line.startswith('| `')]
    assert [re.match(r'\| `([^`]+)`', row).group(1) for row in rows] == list(process.EFFECTS)
    with open(os.path.join(ROOT, 'docs', 'environment.md'), encoding='utf-8') as f:
        assert '(process.md)' in f.read()


def test_the_same_on_every_rank_lists_the_agreed_variables():
    with open(os.path.join(ROOT, 'docs', 'environment.md'), encoding='utf-8') as f:
        text = f.read()
    section = text.split('## The same on every rank')[1].split('\n## ')[0]
    assert set(re.findall(r'`(CHAINERMN_[A-Z_]+)`', section)) == set(protocol.AGREED_VARIABLES)
