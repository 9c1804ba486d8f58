"""The sha256 digests that bind files together: a model to its tokenizer, a run to its corpus, a
manifest to the files it lists."""

import hashlib
import os


def files_sha256(paths, names=None):
    """The sha256 (hex) of the files' bytes one after the other, read in blocks; with `names`,
    each file's name (bytes) goes in before its contents. OSError names a file that cannot be read."""
    digest = hashlib.sha256()
    for number, path in enumerate(paths):
        if names is not None:
            digest.update(names[number])
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def tree_sha256(path):
    """Hash of a file, or of a folder's files (each one's path inside it, then its contents, in
    sorted order)."""
    if os.path.isfile(path):
        return files_sha256([path])
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    return files_sha256(files, names=[os.path.relpath(f, path).encode() for f in files])


def tokenizer_digest(tokenizer):
    """sha256 of a SentencePiece model: what binds a model to its tokenizer."""
    return hashlib.sha256(tokenizer.serialized_model_proto()).hexdigest()
