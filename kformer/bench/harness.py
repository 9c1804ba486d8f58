"""What every benchmark shares: variants measured in interleaved rounds, each round's ratio to a
baseline with the median and range of those ratios, the peak memory of a process, and the results
printed as a table (kept as JSON if asked); translations are scored by kformer.evaluate.score.

A machine's speed can change for seconds at a time: measured in turns, every variant meets the same
changes, and ratios taken round by round cancel them where ratios of medians would not."""

import json
import os
import re
import resource
import statistics
import time


class Stopwatch:
    """`with Stopwatch() as watch:` -> watch.seconds (wall) and watch.cpu_seconds (the process's,
    all its threads) of the block."""

    def __enter__(self):
        self._started = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exception):
        self.seconds = time.perf_counter() - self._started[0]
        self.cpu_seconds = time.process_time() - self._started[1]


def interleave(variants, rounds, measure, progress=lambda *a, **k: None, describe=lambda result: "done"):
    """{label: [measure(variant, round) of each round]} for `variants` {label: variant}: `rounds`
    rounds of every variant in turn, the order rotating by one each round, so that none always
    runs right after the same other. `progress` (print-like): the round and label before each
    measurement, `describe(its result)` after."""
    labels = list(variants)
    found = {label: [] for label in labels}
    for number in range(rounds):
        shift = number % len(labels)
        for label in labels[shift:] + labels[:shift]:
            progress(f"round {number + 1}/{rounds}: {label} ...", end=" ", flush=True)
            found[label].append(measure(variants[label], number))
            progress(describe(found[label][-1]))
    return found


def spread(ours, theirs):
    """(median, lowest, highest) of ours[i] / theirs[i]: the ratio round by round, and how far one
    round's can be from the median in this run."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def reduced(rounds, medians=(), peaks=()):
    """One result from a variant's rounds (dicts): the median of each key of `medians`, the highest
    of each of `peaks`, the others as the first round has them."""
    result = dict(rounds[0])
    result.update({key: statistics.median(r[key] for r in rounds) for key in medians})
    result.update({key: max(r[key] for r in rounds) for key in peaks})
    return result


def memory_mb(field="VmHWM", pid="self"):
    """A process's memory in MB, as Linux counts it in /proc: VmHWM its peak resident, VmRSS its
    resident now. VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across execve, so a
    child would report its parent's peak. Without /proc, this process's ru_maxrss."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        if pid != "self":
            raise
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def waited(process):
    """(exit code, peak resident MB) of a started subprocess.Popen, once it has ended: the kernel's
    count of the whole process (wait4's ru_maxrss), read when it can no longer grow. Linux carries
    ru_maxrss over the exec, so the count is at least the starting process's own peak: start what
    is measured from a process much smaller than it."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss / 1024


def print_table(columns, rows, title=None):
    """`title` (a line above the table, if given), a header line, then a line a row. `columns`:
    [(heading, spec, cell)], `cell` the key of the row's value (a row being a dict) or a function
    of the row that gives it, `spec` how format() writes it ("8.2f", ">11", "<18"); a heading takes
    the spec's width and alignment (right where the spec gives none)."""

    def heading(text, spec):
        align, width = re.match(r"([<>^]?)(\d*)", spec).groups()
        return f"{text:{align or '>'}{width}}"

    if title:
        print(title)
    print(" ".join(heading(text, spec) for text, spec, _ in columns))
    for row in rows:
        print(" ".join(format(cell(row) if callable(cell) else row[cell], spec) for _, spec, cell in columns))


def report(results, print_results, json_path=None):
    """Prints `results` with `print_results`; writes them to `json_path` too, if given."""
    print_results(results)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
