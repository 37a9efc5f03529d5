"""chainermn_comm.spelling: the closest known name, or nothing when none is close."""

import pytest

from chainermn_comm import COMMUNICATOR_NAMES
from chainermn_comm.reduce import dtypes
from chainermn_comm.spelling import closest, did_you_mean


@pytest.mark.parametrize('word, expected', [
    ('hierachical', 'hierarchical'), ('Hierarchical', 'hierarchical'), ('navie', 'naive'),
    ('pure-nccl', 'pure_nccl'), ('singlenode', 'single_node'), ('xyz', None), ('', None), (None, None),
    (3, None)])
def test_closest_communicator_name(word, expected):
    assert closest(word, COMMUNICATOR_NAMES) == expected


def test_did_you_mean_text_and_aliases():
    assert did_you_mean('docter', ['doctor', 'launch']) == " Did you mean 'doctor'?"
    assert did_you_mean('qqq', ['doctor', 'launch']) == ''
    assert did_you_mean('BF16', ['float16', 'bfloat16'], {'bf16': 'bfloat16'}) == " Did you mean 'bfloat16'?"
    # A misspelt alias is still close to the alias, and the answer is what the alias stands for.
    assert closest('bf61', ['float16', 'bfloat16'], {'bf16': 'bfloat16'}) == 'bfloat16'


@pytest.mark.parametrize('bad, good', [('flaot32', 'float32'), ('fp16', 'float16'), ('bfloat', 'bfloat16'),
                                       ('atuo', 'auto')])
def test_wire_dtype_suggestion(bad, good):
    with pytest.raises(ValueError, match=r"got '{}'\. Did you mean '{}'\?".format(bad, good)):
        dtypes.validate_grad_dtype(bad)


def test_reduction_op_suggestion():
    with pytest.raises(ValueError, match=r"unsupported reduction op 'summ'\. Did you mean 'sum'\?"):
        dtypes.reduction_op('summ')
