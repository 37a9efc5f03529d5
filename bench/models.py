"""Gradient sets the benchmarks reduce: ResNet-50 shapes and a 784-1000-1000-10 MLP."""

import numpy

__all__ = ['param_shapes', 'make_link', 'MODELS']

MODELS = ('resnet50', 'mlp')


def _resnet50_shapes():
    # ResNet50Layers(pretrained_model=None) builds randomly initialised links and downloads nothing.
    from chainer.links.model.vision.resnet import ResNet50Layers
    model = ResNet50Layers(pretrained_model=None)
    return [(name, tuple(p.shape)) for name, p in sorted(model.namedparams())]


def _mlp_shapes(n_in=784, n_units=1000, n_out=10):
    return [('/l1/W', (n_units, n_in)), ('/l1/b', (n_units,)),
            ('/l2/W', (n_units, n_units)), ('/l2/b', (n_units,)),
            ('/l3/W', (n_out, n_units)), ('/l3/b', (n_out,))]


def param_shapes(model, size):
    """Return [(name, shape)] of ``model`` ('resnet50' or 'mlp') at ``size`` ('full' or 'tiny')."""
    if model == 'resnet50':
        shapes = _resnet50_shapes()
        if size == 'tiny':
            shapes = [(n, tuple(max(1, d // 16) if d > 3 else d for d in s)) for n, s in shapes[:48]]
        return shapes
    if model == 'mlp':
        return _mlp_shapes() if size == 'full' else _mlp_shapes(64, 48, 10)
    raise ValueError('unknown model {!r}; use one of {}'.format(model, ', '.join(MODELS)))


def make_link(shapes, seed, dtype=numpy.float32, grad_scale=1.0):
    """Return a chainer.Link with one parameter per shape: random data, random grads times grad_scale."""
    import chainer
    rng = numpy.random.RandomState(seed)
    link = chainer.Link()
    with link.init_scope():
        for i, (name, shape) in enumerate(shapes):
            attr = 'p{:03d}_{}'.format(i, name.strip('/').replace('/', '_'))
            p = chainer.Parameter(rng.standard_normal(shape).astype(dtype))
            p.grad = (rng.standard_normal(shape) * grad_scale).astype(dtype)
            setattr(link, attr, p)
    return link
