"""Training: `train` (fit.py) runs model.fit in a run folder, resumable, within a budget.

checkpoint.py is the run folder; callbacks.py the budget, signals and saves; losses.py,
optimizer.py, schedules.py and precision.py what a step computes; distributed.py several
devices or machines; keep_best.py the dev evaluations; init_from.py fine-tuning from a run.
"""


def __getattr__(name):  # `from kformer.train import train` without importing TensorFlow for the rest
    if name == "train":
        from kformer.train.fit import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
