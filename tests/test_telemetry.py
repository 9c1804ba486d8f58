"""kformer/__init__.py turns onnxruntime's telemetry off unless the user said otherwise."""

import os

from conftest import python_lines

# One onnxruntime session of a one-node model, with kformer imported first, as every command does.
SESSION = """
import kformer, onnxruntime
from onnx import TensorProto, helper
x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in "xy")
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
import os; print(os.environ.get("ORT_DISABLE_TELEMETRY", "unset"))
"""


# onnxruntime keeps its telemetry off where one of these says it runs in CI (its binary's list):
# unset, so that the test sees what a user's machine does.
CI_VARIABLES = (
    "CI TF_BUILD GITHUB_ACTIONS GITLAB_CI CIRCLECI TRAVIS JENKINS_URL CODEBUILD_BUILD_ID BUILDKITE "
    "TEAMCITY_VERSION APPVEYOR BITBUCKET_BUILD_NUMBER"
).split()


def _telemetry_files(home, **env):
    """(the setting onnxruntime ran with, the files it left under `home`/.cache/Microsoft)."""
    unset = ("ORT_DISABLE_TELEMETRY", *CI_VARIABLES)
    environment = {k: v for k, v in os.environ.items() if k not in unset}
    lines = python_lines(SESSION, env={**environment, "HOME": str(home), **env})
    left = [os.path.join(d, f) for d, _, files in os.walk(home / ".cache" / "Microsoft") for f in files]
    return lines[-1], left


def test_onnxruntime_keeps_no_device_id_or_events_unless_asked(tmp_path):
    assert _telemetry_files(tmp_path / "default") == ("1", [])
    setting, left = _telemetry_files(tmp_path / "asked", ORT_DISABLE_TELEMETRY="0")  # the user's choice
    assert setting == "0" and any(path.endswith("deviceid") for path in left), left
