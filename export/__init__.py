"""Export a trained kformer model to SavedModel, TFLite and ONNX, verify each, and run them.

`export.exporter.export` builds the translator once and writes every format from it.
`export.runtime` (numpy + sentencepiece) with `export.run_onnx` / `export.run_tflite` runs the
artifacts without TensorFlow; `export.run_tf` runs the SavedModel or the Keras model.
"""
