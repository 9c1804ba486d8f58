"""What kformer writes to disk and reads back, each a typed value in one home, below every stage.

json_records.py reads and writes JSON (atomically) and turns it into frozen dataclasses, checked
field by field; digests.py the sha256 that binds files together; pair.py a language pair; run.py
a training run's folder; prepared.py a prepared corpus (`kformer prepare`); export.py an export
folder's manifest.json. Nothing here imports TensorFlow, Keras or another kformer stage: a device
runner reads an export with the standard library.
"""

TOKENIZER_FILE = "tokenizer.model"  # the SentencePiece model in a run, a prepared corpus and an export
