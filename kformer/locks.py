"""One process at a time per run folder: a lock that dies with its process.

`hold(folder, command)` takes an exclusive `flock` on `.NAME.lock` beside the folder (the folder
itself may not exist yet: a run's files appear only when training starts), and removes the file
when it lets go. A second process on the same folder is refused with the first one's PID; the
kernel drops the lock when its process ends, however it ends, so a killed run never blocks the
next. Within one process the lock is re-entrant (a notebook may start the same run again)."""

import fcntl
import os

_held = {}  # lock file path -> [open file, count]: the locks this process holds


class FolderInUse(ValueError):
    """Another process holds the folder; the message names it and its PID."""


def _lock_file(folder):
    folder = os.path.abspath(folder)
    return os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.lock")


def hold(folder, command):
    """Takes the lock of `folder` for `command` (a name for the message); returns a release
    function. Raises FolderInUse if another process holds it."""
    path = _lock_file(folder)
    if path in _held:
        _held[path][1] += 1
        return lambda: _release(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise FolderInUse(
                f"{folder} is in use by {holder}; wait for it to finish or stop it (nothing was written)"
            ) from None
        if _same_file(handle, path):
            break
        handle.close()  # its holder removed it as we opened it: take the one at `path` now
    handle.seek(0)
    handle.truncate()
    handle.write(f"kformer {command} (PID {os.getpid()})")
    handle.flush()
    _held[path] = [handle, 1]
    return lambda: _release(path)


def _same_file(handle, path):
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def nothing():
    """The release function of a process that holds no lock (a worker other than the chief)."""


def _release(path):
    entry = _held.get(path)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[path]
        os.remove(path)  # while still held: a process waiting on this file sees it gone, and retries
        entry[0].close()  # closing the file drops the flock
