"""kformer: the encoder-decoder Transformer for translation, trained with Keras and exported."""

import os
import sys

# oneDNN's CPU kernels, which TensorFlow turns on by default only on some CPUs (not on AVX2-only
# ones), where they made Keras' translation and the training step faster. TensorFlow reads the setting once, when
# it starts: here, before any kformer module imports it, so notebooks and the commands run the same
# kernels. An explicit TF_ENABLE_ONEDNN_OPTS=0 wins; a TensorFlow started before kformer keeps its own.
if "tensorflow" not in sys.modules:
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# onnxruntime's telemetry, on in its 1.31 wheels for Linux too (onnxruntime pull request 27379):
# without this, a process that runs an ONNX file keeps a device id and a cache of events to send to
# Microsoft under ~/.cache/Microsoft, and a thread for it. Translation runs on the user's own text
# and machines, so kformer turns it off; onnxruntime reads the setting when it starts.
# ORT_DISABLE_TELEMETRY=0 in the environment keeps it on.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
