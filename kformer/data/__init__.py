"""Data: a corpus becomes training batches.

corpus.py reads, cleans and splits pairs; tokenizer.py is the SentencePiece model; batches.py
buckets token ids into tf.data batches; prepare.py writes a corpus of any size once into a folder
of shards (shards.py: the record format, read into memory or streamed).
"""
