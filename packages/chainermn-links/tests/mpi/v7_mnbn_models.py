"""Chainer v7's own create_mnbn_model cases (a convolution, then BatchNormalization), shared by the rank tests."""

import chainer
import chainer.functions as F
import chainer.links as L

__all__ = ['V7Chain', 'V7ChainList', 'v7_model']


class V7Chain(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(None, 3, 1, 1, 1, nobias=True)
            self.bn = L.BatchNormalization(3)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class V7ChainList(chainer.ChainList):
    def __init__(self):
        super().__init__(L.Convolution2D(None, 3, 1, 1, 1, nobias=True), L.BatchNormalization(3))

    def forward(self, x):
        return F.relu(self[1](self[0](x)))


def v7_model(kind):
    """Return v7's model of ``kind``: 'sequential', 'chain' or 'chainlist'."""
    if kind == 'sequential':
        return chainer.Sequential(L.Convolution2D(None, 3, 1, 1, 1, nobias=True),
                                  L.BatchNormalization(3), F.relu)
    return V7Chain() if kind == 'chain' else V7ChainList()
