"""Settings of the notebooks in notebooks/, so that they hold no logic of their own.

KFORMER_NOTEBOOK_CONFIG: the preset ("small" by default; CI runs them with "tiny").
KFORMER_NOTEBOOK_DIR: where they write (default runs/notebooks).
KFORMER_NOTEBOOK_MINUTES: training time of notebook 1 (default 10; CI: a few steps).
"""

import os
import timeit


def project_root():
    """Notebooks run from notebooks/ (Jupyter) or from the project root (scripts)."""
    return (
        "."
        if os.path.exists("pyproject.toml") or not os.path.exists(os.path.join("..", "pyproject.toml"))
        else ".."
    )


def settings():
    root = project_root()
    config = os.environ.get("KFORMER_NOTEBOOK_CONFIG", "small")
    work = os.environ.get("KFORMER_NOTEBOOK_DIR", os.path.join(root, "runs", "notebooks"))
    demo_dir = os.path.join(root, "runs", "demo")
    tiny = config == "tiny"
    trained_here = os.path.join(work, f"train-{config}")
    # A real run shows the README demo's model when there is one; CI uses notebook 1's tiny model.
    use_demo = not tiny and os.path.exists(os.path.join(demo_dir, "model.keras"))
    return {
        "config": config,
        "work_dir": work,
        "train_dir": trained_here,
        "model_dir": demo_dir if use_demo else trained_here,
        "export_dir": os.path.join(work, f"export-{config}"),
        "minutes": float(os.environ.get("KFORMER_NOTEBOOK_MINUTES", "10")),
        "steps": 10 if tiny else None,
        "evaluate_sentences": 40 if tiny else None,
    }


def median_seconds(function, *args, repeats=3):
    """Median wall time of `function(*args)` after one warm-up call."""
    function(*args)
    times = timeit.repeat(lambda: function(*args), repeat=repeats, number=1)
    return sorted(times)[len(times) // 2]
