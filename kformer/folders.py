"""A folder written whole or not at all: work in a temporary sibling, rename it at the end.

Used by `kformer export` and `kformer prepare`: a failed or killed run leaves no folder that
looks finished, and the next run removes the temporary folders of killed ones (their process is
gone)."""

import contextlib
import os
import shutil
import tempfile


@contextlib.contextmanager
def work_folder(out_dir, prefix):
    """Yields a new temporary sibling of `out_dir` (named `prefix` + PID + ...) to write in; it
    becomes `out_dir` (which must not exist, or be empty) when the block ends without an error,
    and is removed when it fails."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    remove_abandoned(parent, prefix)
    work = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(work, 0o777 & ~umask)  # mkdtemp's 0700 would keep the finished folder from others
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if os.path.exists(out_dir):
        os.rmdir(out_dir)  # empty: the callers refuse a folder with files before any work
    os.replace(work, out_dir)


def remove_abandoned(parent, prefix):
    """Removes the temporary folders (`prefix` + PID + ...) whose process no longer runs."""
    for name in os.listdir(parent):
        pid = name[len(prefix) :].split("-")[0] if name.startswith(prefix) else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and os.path.exists("/proc/self"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def size(path):
    """Bytes of a file, or of all the files of a folder (a SavedModel, a CTranslate2 model)."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)
