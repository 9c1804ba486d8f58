"""Python code run in a process of its own: for runtimes that must not share a process with
TensorFlow (onnxruntime-extensions), and for measurements that must not share one with others."""

import subprocess
import sys


class Failed(RuntimeError):
    """The process exited with an error; the message is the end of its stderr."""


def run_python(code, *args, stdin=None, cwd=None, env=None):
    """Runs `python -c code args...` with this interpreter; returns its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args], input=stdin, capture_output=True, text=True, cwd=cwd, env=env
    )
    if result.returncode:
        raise Failed(result.stderr[-2000:])
    return result.stdout
