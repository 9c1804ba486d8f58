"""The training callbacks' time accounting (kformer.callbacks)."""

import types

import keras

from kformer import callbacks


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
