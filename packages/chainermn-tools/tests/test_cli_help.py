"""``python -m chainermn``: the command list, every command's usage line, and "did you mean"."""

import subprocess
import sys

import pytest

from chainermn_tools import cli


def test_usage_lists_every_command_on_one_line():
    assert set(cli.SUMMARIES) == set(cli.COMMANDS)
    lines = cli.USAGE.splitlines()
    assert lines[0] == 'usage: python -m chainermn COMMAND [ARGS ...]'
    for name in cli.COMMANDS:
        mine = [ln for ln in lines if ln.split()[:1] == [name]]
        assert len(mine) == 1, (name, cli.USAGE)
        assert cli.SUMMARIES[name] in mine[0] and len(mine[0]) <= 100, mine
    assert 'python -m chainermn COMMAND --help' in cli.USAGE


def test_no_command_exits_2_with_the_list_and_help_exits_0(capsys):
    assert cli.main([]) == 2
    assert capsys.readouterr().out == cli.USAGE
    for flag in ('-h', '--help', 'help'):
        assert cli.main([flag]) == 0
        assert capsys.readouterr().out == cli.USAGE


@pytest.mark.parametrize('typed, meant', [('docter', 'doctor'), ('lanuch', 'launch'), ('Trace', 'trace'),
                                          ('clutser', 'cluster')])
def test_misspelt_command_gets_a_suggestion(capsys, typed, meant):
    assert cli.main([typed]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m chainermn: unknown command {!r}. Did you mean {!r}?\n".format(
        typed, meant)), err
    assert cli.USAGE in err


def test_unknown_command_without_a_close_one(capsys):
    assert cli.main(['frobnicate']) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'." in err and 'Did you mean' not in err


@pytest.mark.parametrize('name', sorted(cli.COMMANDS))
def test_every_command_help_starts_with_its_usage_line(name):
    res = subprocess.run([sys.executable, '-m', 'chainermn_tools', name, '--help'], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith('usage: python -m chainermn {} '.format(name)), res.stdout
