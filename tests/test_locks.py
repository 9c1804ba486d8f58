"""One process per run folder: a second is refused with the first one's PID, and the lock of a
killed process blocks nothing."""

import os
import subprocess
import time

import pytest
from conftest import KFORMER, PYTHON, run_kformer, run_process

from kformer import locks, run_folder

HOLD = (
    "import sys, time; from kformer import locks; locks.hold(sys.argv[1], 'train'); "
    "print('held', flush=True); time.sleep(120)"
)


def test_a_second_process_is_refused_and_a_killed_holder_blocks_nothing(tmp_path):
    folder = str(tmp_path / "run")
    holder = subprocess.Popen([PYTHON, "-c", HOLD, folder], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(locks.FolderInUse, match=rf"run is in use by kformer train \(PID {holder.pid}\)"):
            locks.hold(folder, "train")
    finally:
        holder.kill()
        holder.wait()
    release = locks.hold(folder, "train")  # the kernel dropped the killed process's lock
    assert os.listdir(tmp_path) == [".run.lock"]  # beside the folder, which it does not create
    release()
    assert os.listdir(tmp_path) == []  # removed when let go


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    folder = str(tmp_path / "run")
    first, second = locks.hold(folder, "train"), locks.hold(folder, "train")  # a notebook starting again
    first()
    check = run_process([PYTHON, "-c", HOLD.replace("time.sleep(120)", "pass"), folder])
    assert check.status != 0 and "FolderInUse" in check.stderr  # still held: one release left
    second()
    check = run_process([PYTHON, "-c", HOLD.replace("time.sleep(120)", "pass"), folder])
    assert check.status == 0, check.stderr


TRAIN = ["train", "--config", "tiny", "--vocab-size", "1200", "--no-xla"]


@pytest.mark.slow
def test_two_trainings_on_one_folder(tmp_path, corpus_tsv):
    """The second `kformer train` on the same --out exits 2 naming the first; after the first is
    killed, a third resumes from its checkpoint."""
    out = str(tmp_path / "run")
    command = [*TRAIN, "--data", corpus_tsv, "--out", out]
    first = subprocess.Popen(  # killed while it trains: no helper waits for it
        [*KFORMER, *command, "--steps", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(run_folder.path(out, run_folder.CONFIG_FILE)):  # training started
            assert first.poll() is None and time.monotonic() < deadline, "the first run did not start"
            time.sleep(0.2)
        second = run_kformer(*command, "--steps", "3")
        assert second.status == 2, second.stderr
        assert second.stderr.strip().endswith(
            f"run is in use by kformer train (PID {first.pid}); wait for it to finish or stop it (nothing was written)"
        ), second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.kill()
        first.wait()
    third = run_kformer(*command, "--steps", "2")
    assert third.status == 0, third.stderr[-2000:]
