"""Where a training step's time goes: TensorFlow's profiler around `fit`, summed by op type.

The trace stays on disk for TensorBoard's Profile tab (`tensorboard --logdir DIR`, with the
tensorboard-plugin-profile package); the summary here needs neither: TensorFlow's own converter
turns the trace into its per-op table (the Profile tab's "framework op stats"), whose self-times
are added up by op type for each place ops ran ("Host": CPU threads; "Device": a GPU).
"""

import glob
import json
import os


def profile_fit(model, datasets, directory):
    """Runs `model.fit` over each of `datasets` under TensorFlow's profiler, the trace written
    under `directory`; returns that run's trace files (*.xplane.pb)."""
    import tensorflow as tf

    before = set(_traces(directory))
    tf.profiler.experimental.start(directory)
    try:
        for dataset in datasets:
            model.fit(dataset, shuffle=False, verbose=0)
    finally:
        tf.profiler.experimental.stop()
    return sorted(set(_traces(directory)) - before)


def _traces(directory):
    return glob.glob(os.path.join(directory, "plugins", "profile", "*", "*.xplane.pb"))


def op_types(traces, steps, top=8):
    """The op types that took the most self-time in `traces`, per place, over `steps` steps:
    [{"where", "type", "ms_per_step", "share"}] ordered by place, then time; share: of the place's
    busy self-time. A host's idle thread-time comes as type "IDLE" (its share: of busy + idle)."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin

    data, ok = _pywrap_profiler_plugin.xspace_to_tools_data(traces, "framework_op_stats", {})
    if not ok or not data:
        raise RuntimeError(f"TensorFlow's profiler gave no op table for {traces}")
    table = json.loads(data)[0]  # the first of its tables counts idle time too
    columns = [c["id"] for c in table["cols"]]
    where, kind, self_us = (columns.index(k) for k in ("host_or_device", "type", "total_self_time"))
    totals = {}  # (place, op type) -> microseconds
    for row in table["rows"]:
        values = [cell.get("v") for cell in row["c"]]
        key = (values[where], values[kind])
        totals[key] = totals.get(key, 0.0) + values[self_us]
    rows = []
    for place in sorted({p for p, _ in totals}):
        ranked = sorted(
            ((us, t) for (p, t), us in totals.items() if p == place and t != "IDLE"), reverse=True
        )
        busy, idle = sum(us for us, _ in ranked), totals.get((place, "IDLE"), 0.0)
        shown = [(us, op, busy) for us, op in ranked[:top]]  # (microseconds, type, what its share is of)
        if idle:
            shown.append((idle, "IDLE", busy + idle))
        rows += [
            {"where": place, "type": op, "ms_per_step": us / 1e3 / steps, "share": us / whole}
            for us, op, whole in shown
        ]
    return rows
