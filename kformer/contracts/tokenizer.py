"""tokenizer.json: a tokenizer whose ids come from a vocabulary rather than from SentencePiece's own
ids, as imported models have them (Marian's vocab.json over source.spm and target.spm). A folder
without tokenizer.json has the one joint SentencePiece model kformer trains, tokenizer.model."""

import dataclasses

from kformer.contracts.json_records import Record

TOKENIZER_JSON = "tokenizer.json"


@dataclasses.dataclass(frozen=True)
class TokenizerFile(Record):
    """A file of the tokenizer, in its folder, and its sha256."""

    file: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class VocabularyRecord(Record):
    """`source` segments the source text into pieces and `target` joins output pieces into text
    (SentencePiece models); `vocabulary` lists the model's pieces in id order (a JSON list);
    `append_eos`: the source's ids end with EOS, as the family trained; the special ids."""

    source: TokenizerFile
    target: TokenizerFile
    vocabulary: TokenizerFile
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int
    append_eos: bool = True
