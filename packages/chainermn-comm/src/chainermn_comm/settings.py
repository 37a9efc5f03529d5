"""Read every ``CHAINERMN_*`` environment variable through one parser, with one kind of error.

>>> from chainermn_comm import settings
>>> settings.read('CHAINERMN_CHECK')          # True unless the user set it to 0
True

A value that cannot be understood raises ``ValueError`` naming the variable, the value, what it
takes and what it does; :func:`check_environment` does that for every variable that is set (and
warns about ``CHAINERMN_*`` names that chainermn does not know), so a typo fails at start-up
instead of being ignored.
"""

import difflib
import os
import warnings

from chainermn_comm.protocol import VARIABLES

__all__ = ['read', 'is_set', 'check_environment', 'in_bounds', 'describe_values',
           'UnknownVariableWarning', 'TRUE_WORDS', 'FALSE_WORDS', 'TEST_PREFIX']

TRUE_WORDS = ('1', 'true', 'yes', 'on')
FALSE_WORDS = ('0', 'false', 'no', 'off')
#: Variables of chainermn's own test suites; never checked.
TEST_PREFIX = 'CHAINERMN_TEST_'


class UnknownVariableWarning(UserWarning):
    """Warned for a ``CHAINERMN_*`` variable that chainermn does not read (a likely typo)."""


def _takes(var):
    if var.kind in ('flag', 'tristate'):
        extra = ', or auto/unset to detect' if var.kind == 'tristate' else ''
        return '1 or 0 (also true/false, yes/no, on/off){}'.format(extra)
    if var.kind == 'choice':
        return 'one of {}'.format(', '.join(var.choices))
    what = 'an integer' if var.kind == 'int' else 'a number'
    if var.minimum is not None and var.maximum is not None:
        what += ' from {} to {}'.format(var.minimum, var.maximum)
    elif var.minimum is not None:
        what += ' >= {}'.format(var.minimum)
    elif var.maximum is not None:
        what += ' <= {}'.format(var.maximum)
    if var.off is not None:
        what += ', or {} for off'.format(var.off)
    return what


def in_bounds(var, number):
    """Return whether ``number`` is a value ``var`` takes: within its bounds, or its 'off' value."""
    if var.off is not None and number == var.off:
        return True
    if var.minimum is not None and not number >= var.minimum:
        return False
    if var.maximum is not None and not number <= var.maximum:
        return False
    return number == number  # NaN is never a setting


def describe_values(name):
    """Return what variable ``name`` takes, e.g. 'a number >= 1, or 0 for off' (for other messages)."""
    return _takes(VARIABLES[name])


def _fail(var, raw):
    default = '' if var.default in (None, '') else ' ({})'.format(var.default)
    raise ValueError('{}={!r} is not understood: it takes {} ({}). Set it to such a value, or '
                     'unset it for the default{}.'.format(var.name, raw, _takes(var),
                                                          var.meaning, default))


def _parse(var, raw):
    value = raw.strip()
    low = value.lower()
    if var.kind in ('flag', 'tristate'):
        if low in TRUE_WORDS:
            return True
        if low in FALSE_WORDS:
            return False
        if var.kind == 'tristate' and low == 'auto':
            return None
        _fail(var, raw)
    if var.kind == 'choice':
        if low in var.choices:
            return low
        _fail(var, raw)
    if var.kind in ('int', 'float'):
        try:
            number = int(value) if var.kind == 'int' else float(value)
        except ValueError:
            _fail(var, raw)
        if not in_bounds(var, number):
            _fail(var, raw)
        return number
    return value


def read(name, default=None, environ=None):
    """Return the value of ``name`` parsed by its kind; its default (or ``default``) when unset or empty."""
    var = VARIABLES[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return var.default if default is None else default
    return _parse(var, raw)


def is_set(name, environ=None):
    """Return whether ``name`` is set to a non-empty value (a user's choice that pins a knob)."""
    VARIABLES[name]  # KeyError for names chainermn does not read
    return bool((os.environ if environ is None else environ).get(name, '').strip())


def check_environment(environ=None):
    """Parse every set ``CHAINERMN_*`` variable (ValueError on the first bad one); warn on unknown names."""
    env = os.environ if environ is None else environ
    for name in sorted(env):
        if not name.startswith('CHAINERMN_') or name.startswith(TEST_PREFIX):
            continue
        if name in VARIABLES:
            read(name, environ=env)
            continue
        close = difflib.get_close_matches(name, list(VARIABLES), n=1)
        hint = ' Did you mean {}?'.format(close[0]) if close else ''
        warnings.warn('{} is set but chainermn does not read it.{} Known variables: see '
                      'chainermn_comm.protocol.VARIABLES.'.format(name, hint),
                      UnknownVariableWarning, stacklevel=2)
