"""Pages of mapped model files handed back (export/memory.py), each check in a process of its own
so that the test process's mappings play no part."""

import pytest
from conftest import BEAM, python_lines

from kformer.export import memory

pytestmark = pytest.mark.skipif(memory._madvise() is None, reason="Linux only (madvise, /proc/self/maps)")

RESIDENT = """
def resident_mb(path):  # the resident MB of this process's mappings of the file at `path`
    kb, inside = 0, False
    for line in open("/proc/self/smaps"):
        if "-" in line.split()[0]:  # a mapping's first line: "start-end perms offset device inode path"
            inside = line.rstrip().endswith(path)
        elif inside and line.startswith("Rss:"):
            kb += int(line.split()[1])
    return kb / 1024
"""


def test_a_mapped_files_pages_are_dropped_and_read_again(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 32768)  # 8 MB
    script = """
import hashlib, mmap, sys
from kformer.export import memory
path = sys.argv[1]
with open(path, "rb") as f:
    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # read-only, as LiteRT maps a model
digest = hashlib.md5(mapped).hexdigest()  # every page touched
touched = resident_mb(path)
dropped = memory.drop_file_pages(path)
left = resident_mb(path)
print(touched, dropped / 2**20, left, hashlib.md5(mapped).hexdigest() == digest, resident_mb(path))
with open(path, "r+b") as f:
    writable = mmap.mmap(f.fileno(), 0)
print(memory.drop_file_pages(path) / 2**20)  # the read-only mapping's 8 MB again, not the writable's
"""
    first, second = python_lines(RESIDENT + script, str(path))[-2:]
    touched, dropped, left, same, reread = first.split()
    assert float(touched) > 7.9 and float(dropped) == 8 and float(left) < 0.5, first
    assert same == "True" and float(reread) > 7.9, first
    assert float(second) == 8, second


def test_a_tflite_file_is_packed_and_its_pages_dropped_before_its_first_real_call(artifacts):
    """XNNPACK packs a file's weights from its mapped pages the first time a loop runs: the runner
    has it do so in a call of one token, and drops the pages, before the first call it was asked
    for, so that the pages, the packed copies and a real call's buffers are not all resident at
    once."""
    script = """
import os, sys
from kformer.decode.options import SearchOptions
from kformer.export import memory, tflite
events, drop, invoke = [], memory.drop_file_pages, tflite.TfliteRunner._invoke
def dropping(path):
    share = resident_mb(os.path.realpath(path)) / (os.path.getsize(path) / 2**20)
    events.append(f"drop:{os.path.basename(path)}:{share > 0.5}:{drop(path) > 0}")
def invoking(signature, options, batch):
    events.append(f"call:{options.search}:{batch.shape[0]}x{batch.shape[1]}")
    return invoke(signature, options, batch)
memory.drop_file_pages, tflite.TfliteRunner._invoke = dropping, staticmethod(invoking)
options = SearchOptions(beam_size=int(sys.argv[2]))
runner, texts = tflite.TfliteRunner(sys.argv[1], options=options), ["我們試試看！", "他很高興。"]
for search in (SearchOptions(beam_size=1), options):
    first = runner.translate(texts, search)
    print(" ".join(events), runner.translate(texts, search) == first)  # pages read again
    events.clear()
"""
    greedy, beam = python_lines(RESIDENT + script, artifacts, str(BEAM))[-2:]
    # The file was read (packed) before the drop, which handed its pages back; then the real calls.
    assert greedy.startswith("call:greedy:1x1 drop:greedy.tflite:True:True call:greedy:2x"), greedy
    assert beam.startswith("call:beam:1x1 drop:beam.tflite:True:True call:beam:2x"), beam
    assert greedy.endswith("True") and beam.endswith("True"), (greedy, beam)
