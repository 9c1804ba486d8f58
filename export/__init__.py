"""kformer.export: write a trained model to SavedModel, TFLite, ONNX and CTranslate2, verify each
file against Keras, and run them.

`kformer.export.exporter.export` builds the translator once (`module.ExportModule`) and writes
every format of the registry (`formats.FORMATS`: one module per format, with its writer, runner
and variants); `formats.open_runner` is the one way to get a translator. The ONNX, TFLite and
CTranslate2 runners need numpy, sentencepiece and their runtime only, never TensorFlow.
"""
