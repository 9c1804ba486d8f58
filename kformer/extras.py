"""Optional dependencies: which extra of `pip install 'kformer[EXTRA]'` brings a module.

pyproject.toml is their one home; this reads it back from the installed package's metadata, so
that a command missing one names the extra to install instead of ending in a traceback. (The
README's commands install every extra.)
"""

import re
from importlib import metadata, util


def extra_for(module):
    """The extra that brings `module` (an import name such as "tf2onnx" or "matplotlib.pyplot"),
    or None when none does: a required package, an unknown one, or kformer not installed."""
    try:
        requirements = metadata.requires("kformer") or []  # required packages first, then the extras'
    except metadata.PackageNotFoundError:
        return None
    for requirement in requirements:  # e.g. 'tf2onnx==1.17.0; extra == "export"'
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower().replace("-", "_")
        if name == module.partition(".")[0]:
            extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
            return extra and extra.group(1)
    return None


def missing(module, purpose):
    """One line for a missing `module`: what needs it and how to install it."""
    name = module.partition(".")[0]  # "matplotlib" of "matplotlib.pyplot"
    extra = extra_for(name)
    how = f"pip install 'kformer[{extra}]'" if extra else f"pip install {name}"
    return f"{purpose} needs {name}, which is not installed: {how}"


def require(module, purpose):
    """Raises a one-line ValueError (`missing`) before any work when `module` is not installed."""
    if util.find_spec(module) is None:
        raise ValueError(missing(module, purpose))
