"""A folder written whole or not at all: work in a temporary sibling, rename it at the end.

Used by `kformer export` and `kformer prepare`: a failed or killed run leaves no folder that
looks finished, and the next run removes the temporary folders of killed ones. A temporary
folder records its owner (OWNER_FILE: the host, this boot of it, the process), and only one made
on this host by a process that no longer runs is removed: on storage that several machines
share, another machine's folder is its own business, whatever its PID means here; one without a
record (written by an older kformer) is left alone too."""

import contextlib
import json
import os
import shutil
import socket
import tempfile

from kformer.contracts.json_records import write_json

OWNER_FILE = ".kformer-owner.json"


@contextlib.contextmanager
def work_folder(out_dir, prefix):
    """Yields a new temporary sibling of `out_dir` (named `prefix` + PID + ...; a link is
    followed to the folder it names) to write in; it becomes `out_dir` (which must not exist, or
    be empty) when the block ends without an error, and is removed when it fails."""
    out_dir = os.path.realpath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    remove_abandoned(parent, prefix)
    work = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(work, 0o777 & ~umask)  # mkdtemp's 0700 would keep the finished folder from others
    try:
        claim(work)
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    release(work)
    if os.path.exists(out_dir):
        os.rmdir(out_dir)  # empty: the callers refuse a folder with files before any work
    os.replace(work, out_dir)


def claim(folder):
    """Records in `folder` that this process on this host is writing it (`remove_abandoned`)."""
    write_json(
        os.path.join(folder, OWNER_FILE), {**_host(), "pid": os.getpid(), "started": _started(os.getpid())}
    )


def release(folder):
    """Takes the owner record out of a folder that is now finished."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, OWNER_FILE))


def remove_abandoned(parent, prefix):
    """Removes the temporary folders (`prefix` + ...) of `parent` that this host's processes
    left when they were killed (`is_abandoned`)."""
    for name in os.listdir(parent):
        if name.startswith(prefix) and is_abandoned(os.path.join(parent, name)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def is_abandoned(folder):
    """True where the folder's owner record names this host (and this boot of it) and a process
    that no longer runs (or whose PID another process has taken since); False for a folder
    without a record, or of another host."""
    try:
        with open(os.path.join(folder, OWNER_FILE), encoding="utf-8") as f:
            owner = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(owner, dict) or {key: owner.get(key) for key in ("host", "boot")} != _host():
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if not _running(pid):
        return True
    started = _started(pid)
    return owner.get("started") is not None and started is not None and started != owner["started"]


def _host():
    """This machine as owner records name it: its host name and the id of this boot (Linux), so
    that two machines that share a host name, or one machine before and after a restart (whose
    old PIDs mean nothing now), are not taken for one. After a restart, leftovers stay."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return {"host": socket.gethostname(), "boot": boot}


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def _started(pid):
    """When process `pid` started (clock ticks since boot; Linux), or None where not known."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def size(path):
    """Bytes of a file, or of all the files of a folder (a SavedModel, a CTranslate2 model)."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)
