"""The Ctrl-C line names the trainer's iteration wherever the interrupt landed, in a generator too."""

from chainermn_comm import voice


class Updater:
    iteration = 60


class Trainer:
    """Stands in for chainer.training.Trainer (found by name on the stack)."""

    updater = Updater()

    def run(self, body):
        body()


def _params():
    yield 1
    raise KeyboardInterrupt   # Ctrl-C lands inside a link's namedparams generator


def _interrupt_in_a_generator():
    for _ in _params():
        pass


def test_the_iteration_is_found_from_a_generator_frame():
    try:
        Trainer().run(_interrupt_in_a_generator)
    except KeyboardInterrupt as e:
        tb = e.__traceback__
    inner = tb
    while inner.tb_next is not None:
        inner = inner.tb_next
    assert inner.tb_frame.f_code.co_name == '_params' and inner.tb_frame.f_back is None
    assert voice.interrupted_line(tb).startswith(
        'chainermn: the job was interrupted (Ctrl-C) at iteration 60')


def test_without_a_trainer_the_line_says_so_plainly():
    try:
        _interrupt_in_a_generator()
    except KeyboardInterrupt as e:
        tb = e.__traceback__
    assert voice.interrupted_line(tb).startswith('chainermn: the job was interrupted (Ctrl-C)')
    assert 'iteration' not in voice.interrupted_line(tb).split(';')[0]
