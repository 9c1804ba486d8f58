"""Training: `train` (fit.py) runs model.fit in a run folder, resumable, within a budget.

options.py is what a run is asked for; recipe.py how a preset trains (TrainingRecipe);
run_data.py its config, corpus and tokenizer; inputs.py its batches; callbacks.py the budget,
signals and saves; losses.py, optimizer.py, schedules.py, precision.py and precision_probe.py
what a step computes; distributed.py several devices or machines; keep_best.py the dev
evaluations; init_from.py fine-tuning from a run. The run folder's files are
kformer.run_folder's.
"""


def __getattr__(name):  # `from kformer.train import train` without importing TensorFlow for the rest
    if name == "train":
        from kformer.train.fit import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
