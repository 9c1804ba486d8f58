"""The training callbacks' time accounting (kformer.train.callbacks)."""

import types

import keras

from kformer.train import callbacks


def test_budget_speed_leaves_out_compile_stalls(monkeypatch):
    """XLA compiles each new bucket shape when it first comes: on a GPU a step of milliseconds
    then takes seconds. Counted in the speed, those stalls would shrink the schedule's step
    estimate for the whole run; the budget's clock still counts them."""
    clock = [100.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    iterations = keras.Variable(0)
    model = types.SimpleNamespace(optimizer=types.SimpleNamespace(iterations=iterations), stop_training=False)
    budget = callbacks.Budget(schedule=None, minutes=10)
    budget.set_model(model)
    budget.on_train_begin()
    seconds = [30.0] + [0.1] * 20 + [8.0] + [0.1] * 19 + [6.0]  # compiles: the first step, two shapes later
    for step, took in enumerate(seconds, 1):
        clock[0] += took
        iterations.assign(step)
        budget.on_train_batch_end(step - 1)
    assert abs(budget.steps_per_second() - 10.0) < 1e-6  # 41 steps after the first in 4.1 s of steps
    assert abs(budget.elapsed() - sum(seconds)) < 1e-6 and not model.stop_training


def test_ctrl_c_requests_a_stop_after_the_step_and_gives_sigint_back(monkeypatch):
    """During training the first SIGINT only asks for a stop at the next step's end, and hands
    SIGINT back to what it was (so a second Ctrl-C interrupts at once); training's end hands it
    back too. A handler set outside Python (signal.signal returns None) comes back as Python's."""
    import signal

    def mine(signum, frame):
        pass

    model = types.SimpleNamespace(stop_training=False)
    original = signal.getsignal(signal.SIGINT)  # the test runner's, put back at the end
    for previous, restored in ((mine, mine), (None, signal.default_int_handler)):
        signal.signal(signal.SIGINT, mine)
        if previous is None:
            real = signal.signal
            monkeypatch.setattr(signal, "signal", lambda s, h, real=real: real(s, h) and None)
        stop = callbacks.StopOnInterrupt()
        stop.set_model(model)
        stop.on_train_begin()
        monkeypatch.undo()
        assert signal.getsignal(signal.SIGINT) == stop._request
        stop.on_train_batch_end(0)
        assert not model.stop_training and stop.reason is None
        signal.raise_signal(signal.SIGINT)  # the first Ctrl-C
        assert signal.getsignal(signal.SIGINT) is restored
        stop.on_train_batch_end(1)
        assert model.stop_training and stop.reason == callbacks.INTERRUPTED
        stop.on_train_end()
        assert signal.getsignal(signal.SIGINT) is restored
        model.stop_training = False
    signal.signal(signal.SIGINT, original)
