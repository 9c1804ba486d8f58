"""Text <-> ids inside a graph, in operators every TFLite runtime has built in (no string
tensors, no custom operators): UTF-8, sentence splitting, SentencePiece, and the joining of
translated sentences. `kformer.export.tflite`'s `text` variants are written from it."""
