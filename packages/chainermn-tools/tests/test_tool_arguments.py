"""Every tool refuses a number out of range at parse time, naming the option and what it takes."""

import pytest

from chainermn_tools import doctor, launch, trace
from chainermn_tools.cluster import _cli as cluster
from chainermn_tools._args import count, number, seconds


@pytest.mark.parametrize('main,argv,message', [
    (launch.main, ['--probe-timeout', '-3', '--min-nodes', '1', '--', 'true'],
     'argument --probe-timeout: -3 is out of range: give a number of seconds > 0'),
    (launch.main, ['--heartbeat', '-1', '--min-nodes', '1', '--', 'true'],
     'argument --heartbeat: -1 is out of range: give a number of seconds > 0, or 0 for off'),
    (launch.main, ['--watchdog', '1e-9', '--min-nodes', '1', '--', 'true'],
     'argument --watchdog: 1e-9 is out of range: give a number of seconds >= 1, or 0 for off'),
    (launch.main, ['--max-restarts', '-1', '--min-nodes', '1', '--', 'true'],
     'argument --max-restarts: -1 is out of range: give an integer >= 0'),
    (launch.main, ['--min-nodes', '0', '--', 'true'],
     'argument --min-nodes: 0 is out of range: give an integer >= 1'),
    (launch.main, ['--min-nodes', '1', '--ranks-per-node', 'two', '--', 'true'],
     "argument --ranks-per-node: 'two' is not an integer: give an integer >= 1"),
    (cluster.main, ['--nodes', '0', '--', 'true'],
     'argument --nodes: 0 is out of range: give an integer >= 1 and <= 250'),
    (cluster.main, ['--nodes', '2', '--loss-pct', '101', '--', 'true'],
     'argument --loss-pct: 101 is out of range: give a number of percent >= 0 and <= 100'),
    (cluster.main, ['--nodes', '2', '--link-gbit', '0', '--', 'true'],
     'argument --link-gbit: 0 is out of range: give a number of Gbit/s > 0'),
    (cluster.main, ['--nodes', '2', '--timeout', 'inf', '--', 'true'],
     'argument --timeout: inf is out of range: give a number of seconds > 0'),
    (doctor.main, ['--timeout', '0'], 'argument --timeout: 0 is out of range: give a number of seconds > 0'),
    (trace.main, ['x', '--iterations', '0'], 'argument --iterations: 0 is out of range: give an integer >= 1'),
])
def test_out_of_range_arguments_are_refused(main, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_the_types_keep_their_edges():
    assert seconds()('0.5') == 0.5
    assert seconds(off=0)('0') == 0
    assert number(float, low=1, off=0)('1') == 1.0
    assert count(0)('0') == 0
    assert count(1, 250)('250') == 250
