"""Model: the Transformer and its parts.

config.py holds the network's config and its defaults (ModelConfig, presets); masks.py the one mask
convention; portable.py the export-safe spellings of operations; attention.py, layers.py and
transformer.py the network (encode, and the decoder step that search calls); cache.py the
decoder's key/value cache modes; flops.py counts its operations.
"""
