"""Pages of a memory-mapped model file that a runtime no longer reads, handed back (Linux).

LiteRT maps a .tflite file and its XNNPACK delegate copies the weights of the products it runs
into packed buffers of its own at the first call: from then on the file's pages of those
weights are read by nothing, yet stay resident, so the process holds the weights twice.
Dropping the mapping's pages (madvise MADV_DONTNEED) costs nothing to what still reads the file
(the embedding table's gather, say): those pages come back from the page cache as they are
touched. CTranslate2 and onnxruntime read their weights into buffers of their own."""

import ctypes
import functools
import os
import sys

MADV_DONTNEED = 4  # Linux's value


@functools.cache
def _madvise():
    """libc's madvise(address, length, advice), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise  # the C library the process runs on
    except (OSError, AttributeError):
        return None
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


def drop_file_pages(path):
    """Drops this process's resident pages of its read-only mappings of the file at `path`; what
    still reads them reads them again from the page cache. Writable mappings are left alone (a
    private one's written pages would be lost). Returns the bytes of the mappings dropped: 0 off
    Linux, or where the file is not mapped."""
    madvise, path = _madvise(), os.path.realpath(path)
    if madvise is None:
        return 0
    dropped = 0
    with open("/proc/self/maps") as maps:
        for line in maps:  # "start-end perms offset device inode path"
            fields = line.rstrip("\n").split(maxsplit=5)
            if len(fields) == 6 and fields[5] == path and "w" not in fields[1]:
                start, end = (int(address, 16) for address in fields[0].split("-"))
                if madvise(start, end - start, MADV_DONTNEED) == 0:
                    dropped += end - start
    return dropped
