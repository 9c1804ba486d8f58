"""A tokenizer whose ids come from a vocabulary: source text is segmented by the source
SentencePiece model, each piece looked up in the model's vocabulary (unknown pieces are <unk>), EOS
appended where the family trained so; output ids are looked up back into pieces, which the target
SentencePiece model joins into text, with the vocabulary's pieces it lacks added to it (the
joiner, which joins and never segments): an output piece of the source's side is its text, "▁"
read as a space, as MarianTokenizer reads it, in every runtime (the graphs and the page join with
the same model).
It answers as SentencePieceProcessor does where kformer asks
(encode, decode, id_to_piece, piece_to_id, get_piece_size, the special ids), so every Python
runner takes it as it is."""

import hashlib
import json
import os
import pathlib
import re
from typing import NamedTuple

from kformer.contracts import TOKENIZER_FILE, digests
from kformer.contracts.tokenizer import TOKENIZER_JSON, TokenizerFile, VocabularyRecord
from kformer.data.tokenizer import load_tokenizer

LANGUAGE_CODE = (">>", "<<")  # a multilingual model's target language token, ">>fra<<", starts a source
# The code a source starts with as _encode_one splits it off, in RE2 (the graphs' regular expressions):
# from ">>" to the first "<<" after it, newlines included.
LANGUAGE_CODE_PATTERN = rf"(?s)^({re.escape(LANGUAGE_CODE[0])}.*?{re.escape(LANGUAGE_CODE[1])})"


class VocabularyTokenizer:
    """record: a VocabularyRecord; source, target: SentencePieceProcessors; pieces: the model's
    pieces in id order."""

    def __init__(self, record, source, target, pieces, target_language=None, joiner=None):
        self.record, self.source, self.target, self.pieces = record, source, target, list(pieces)
        self.index = {piece: i for i, piece in enumerate(self.pieces)}
        self.special = {record.pad_id, record.eos_id, record.bos_id}
        self.joiner = joiner or _processor(joiner_proto(target, self.pieces))
        self.prefix = []  # the target language's token, which every source then starts with
        if target_language is not None:
            code = f"{LANGUAGE_CODE[0]}{target_language}{LANGUAGE_CODE[1]}"
            if code not in self.index:
                raise ValueError(
                    f"--target-language {target_language}: {code} is not in the model's vocabulary"
                )
            self.prefix = [self.index[code]]

    def for_target(self, language):
        """This tokenizer with every source starting with `language`'s token (">>fra<<" of "fra"):
        what a multilingual model translates into."""
        return VocabularyTokenizer(self.record, self.source, self.target, self.pieces, language, self.joiner)

    def languages(self):
        """The target languages a multilingual model's vocabulary has tokens of ("fra" of ">>fra<<")."""
        start, end = LANGUAGE_CODE
        return [p[len(start) : -len(end)] for p in self.pieces if p.startswith(start) and p.endswith(end)]

    def _encode_one(self, text):
        code = []
        start, end = LANGUAGE_CODE
        if text.startswith(start) and end in text:  # split off before segmenting, as Marian does
            cut = text.index(end) + len(end)
            code, text = [text[:cut]], text[cut:]
        pieces = code + self.source.encode(text, out_type=str)
        ids = ([] if code else self.prefix) + [self.index.get(piece, self.record.unk_id) for piece in pieces]
        return ids + [self.record.eos_id] if self.record.append_eos else ids

    def encode(self, texts, num_threads=None):
        """The source ids of one text (a list) or of each of several (a list of lists)."""
        return self._encode_one(texts) if isinstance(texts, str) else [self._encode_one(t) for t in texts]

    def encode_target(self, texts):
        """The ids of each target text as the family trains on them: the target SentencePiece
        model's pieces looked up in the vocabulary, with neither a language token nor EOS (the
        batches add the decoder's start and EOS)."""
        unk = self.record.unk_id
        return [[self.index.get(p, unk) for p in self.target.encode(t, out_type=str)] for t in texts]

    def decode(self, ids):
        """The text of output ids (the special tokens left out)."""
        if ids and not isinstance(ids[0], int):
            return [self.decode(row) for row in ids]
        return self.joiner.decode_pieces([self.pieces[i] for i in ids if i not in self.special])

    def id_to_piece(self, i):
        return self.pieces[i]

    def piece_to_id(self, piece):
        return self.index.get(piece, self.record.unk_id)

    def get_piece_size(self):
        return len(self.pieces)

    def pad_id(self):
        return self.record.pad_id

    def unk_id(self):
        return self.record.unk_id

    def bos_id(self):
        return self.record.bos_id

    def eos_id(self):
        return self.record.eos_id

    def serialized_model_proto(self):
        """What identifies the tokenizer (its digest is a model's tokenizer_sha256): its files'
        contents and settings, one after the other."""
        parts = [self.source.serialized_model_proto(), self.target.serialized_model_proto()]
        settings = json.dumps([self.pieces, self.record.append_eos], ensure_ascii=False).encode()
        return b"".join(hashlib.sha256(part).digest() for part in [*parts, settings])


def joiner_proto(target, pieces):
    """The target SentencePiece model (a processor) with each of `pieces` it lacks as a
    USER_DEFINED piece, which SentencePiece (and TF Text, which refuses UNUSED pieces) joins as any
    piece: a model to join outputs with, never to segment with (it would match those pieces
    first). Serialized ModelProto bytes."""
    missing = [p for p in dict.fromkeys(pieces) if target.piece_to_id(p) == target.unk_id()]
    missing = [p for p in missing if p != target.id_to_piece(target.unk_id())]
    return with_pieces(target.serialized_model_proto(), missing, USER_DEFINED)


USER_DEFINED, UNUSED = 4, 5  # sentencepiece's ModelProto.SentencePiece.Type


def with_pieces(proto, pieces, piece_type):
    """A SentencePiece model's bytes `proto` with `pieces` (none of its own) appended, of
    `piece_type`, and without its self-test samples, which SentencePiece checks as it loads a model
    and which the new pieces may segment otherwise."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    for piece in pieces:
        model.pieces.add(piece=piece, score=0.0, type=piece_type)
    model.DiscardUnknownFields()  # the self-test samples: sentencepiece's Python module does not name them
    return model.SerializeToString()


def _processor(proto):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=proto)


def write(folder, source_spm, target_spm, pieces, special, append_eos=True):
    """Writes a vocabulary tokenizer into `folder`: source.spm and target.spm (bytes), the pieces
    (vocabulary.json) and tokenizer.json. `special`: {"pad_id", "unk_id", "bos_id", "eos_id"}."""
    files = {"source": ("source.spm", source_spm), "target": ("target.spm", target_spm)}
    files["vocabulary"] = ("vocabulary.json", json.dumps(list(pieces), ensure_ascii=False).encode())
    entries = {}
    for name, (file, content) in files.items():
        pathlib.Path(folder, file).write_bytes(content)
        entries[name] = TokenizerFile(file, hashlib.sha256(content).hexdigest())
    VocabularyRecord(**entries, **special, append_eos=append_eos).save(os.path.join(folder, TOKENIZER_JSON))


def load(folder):
    """The vocabulary tokenizer of `folder`, each file checked against its sha256."""
    path = os.path.join(folder, TOKENIZER_JSON)
    try:
        record = VocabularyRecord.load(path)
    except ValueError as e:  # another library's tokenizer.json (Hugging Face's), or a damaged one
        raise ValueError(
            f"{e}: not a tokenizer kformer reads (its {TOKENIZER_JSON} names source, target and "
            "vocabulary files)"
        ) from None
    paths = {}
    for name in ("source", "target", "vocabulary"):
        entry = getattr(record, name)
        paths[name] = os.path.join(folder, entry.file)
        if not os.path.exists(paths[name]) or digests.files_sha256([paths[name]]) != entry.sha256:
            raise ValueError(f"{paths[name]} is missing or differs from {TOKENIZER_JSON}'s sha256")
    pieces = json.loads(pathlib.Path(paths["vocabulary"]).read_text(encoding="utf-8"))
    return VocabularyTokenizer(
        record, load_tokenizer(paths["source"]), load_tokenizer(paths["target"]), pieces
    )


def save(tokenizer, folder):
    """Writes `tokenizer` (a SentencePieceProcessor or a VocabularyTokenizer) into `folder` as
    `open_tokenizer` reads it back: tokenizer.model, or tokenizer.json and the files it names."""
    if not maps_through_vocabulary(tokenizer):
        tmp = os.path.join(folder, TOKENIZER_FILE + ".tmp")
        pathlib.Path(tmp).write_bytes(tokenizer.serialized_model_proto())
        os.replace(tmp, os.path.join(folder, TOKENIZER_FILE))
        return
    record = tokenizer.record
    special = {
        "pad_id": record.pad_id,
        "unk_id": record.unk_id,
        "bos_id": record.bos_id,
        "eos_id": record.eos_id,
    }
    source, target = (spm.serialized_model_proto() for spm in (tokenizer.source, tokenizer.target))
    write(folder, source, target, tokenizer.pieces, special, record.append_eos)


def encode_targets(tokenizer, texts):
    """The ids of each target text in `texts`: the joint SentencePiece model's own, or those a
    vocabulary tokenizer maps the target model's pieces to."""
    if maps_through_vocabulary(tokenizer):
        return tokenizer.encode_target(texts)
    return tokenizer.encode(list(texts), num_threads=os.cpu_count() or 1)


def tokenizer_file(folder):
    """The file `open_tokenizer` reads in `folder`: tokenizer.json where there is one, else tokenizer.model."""
    return TOKENIZER_JSON if os.path.exists(os.path.join(folder, TOKENIZER_JSON)) else TOKENIZER_FILE


def open_tokenizer_file(path):
    """The tokenizer of a tokenizer.json (a vocabulary tokenizer's) or a SentencePiece model file."""
    folder, name = os.path.split(path)
    if name == TOKENIZER_JSON and not os.path.exists(path):
        raise FileNotFoundError(f"{path}: tokenizer not found")
    return open_tokenizer(folder or ".", name)


def files(folder):
    """The names of the files of the vocabulary tokenizer in `folder` (tokenizer.json first)."""
    record = VocabularyRecord.load(os.path.join(folder, TOKENIZER_JSON))
    return [TOKENIZER_JSON, record.source.file, record.target.file, record.vocabulary.file]


def open_tokenizer(folder, file=None):
    """The tokenizer of a run, prepared corpus or export folder: `file` (an export manifest's
    tokenizer), else its tokenizer.json where it has one, else tokenizer.model; a tokenizer.json is
    a vocabulary tokenizer, any other file a SentencePiece model."""
    file = file or tokenizer_file(folder)
    return load(folder) if file == TOKENIZER_JSON else load_tokenizer(os.path.join(folder, file))


def tokenizer_files(folder):
    """The files that make up the tokenizer of `folder` (`open_tokenizer`), to copy it whole."""
    return files(folder) if tokenizer_file(folder) == TOKENIZER_JSON else [TOKENIZER_FILE]


def language_codes(tokenizer):
    """{code: model id} of a vocabulary tokenizer's target language tokens (">>fra<<"); a code
    typed at a source's start that is none of them is <unk>, as in _encode_one."""
    start, end = LANGUAGE_CODE
    return {
        f"{start}{language}{end}": tokenizer.piece_to_id(f"{start}{language}{end}")
        for language in tokenizer.languages()
    }


def maps_through_vocabulary(tokenizer):
    """Whether `tokenizer` is a VocabularyTokenizer (an imported model's), not the one joint
    SentencePiece model kformer trains: the one test of it, for what only the joint model allows."""
    return isinstance(tokenizer, VocabularyTokenizer)


class GraphTables(NamedTuple):
    """What a graph needs to tokenize as a tokenizer does (graph_tables)."""

    source: bytes  # the source SentencePiece model
    target: bytes  # the model outputs are joined with (the joiner's, or the joint model's)
    source_map: list | None  # the model id of each source SentencePiece id (None: the same ids)
    target_map: list | None  # the target SentencePiece id of each model id, -1 for a special token
    append_eos: bool  # EOS ends each source
    codes: dict | None  # language_codes, split off a source's start (None: no code is split off)
    unk_id: int


def graph_tables(tokenizer):
    """The GraphTables of `tokenizer` (a SentencePieceProcessor or a VocabularyTokenizer)."""
    if not maps_through_vocabulary(tokenizer):
        proto = tokenizer.serialized_model_proto()
        return GraphTables(proto, proto, None, None, False, None, tokenizer.unk_id())
    source, target = tokenizer.source, tokenizer.joiner
    source_map = [tokenizer.piece_to_id(source.id_to_piece(i)) for i in range(source.get_piece_size())]
    target_map = [
        -1 if i in tokenizer.special else target.piece_to_id(p) for i, p in enumerate(tokenizer.pieces)
    ]
    target_map[tokenizer.unk_id()] = target.unk_id()
    return GraphTables(
        source.serialized_model_proto(),
        target.serialized_model_proto(),
        source_map,
        target_map,
        tokenizer.record.append_eos,
        language_codes(tokenizer),
        tokenizer.unk_id(),
    )
