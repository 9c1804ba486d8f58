"""The SentencePiece tokenizer: one joint model for source and target."""

import io
import os

VOCAB_SIZE = 8000  # pieces of a tokenizer trained here, unless asked for another size
# The special pieces' ids in a tokenizer trained here (pad 0: the mask convention relies on it).
SPECIAL_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}


def train_tokenizer(texts, vocab_size):
    """Trains one joint SentencePiece (unigram) model on `texts`, in memory (the run folder
    writes it once training starts: kformer.run_folder.create).

    Character coverage 0.9995 keeps rare Chinese characters out of the vocabulary only when
    truly rare. No normalization, so decode(encode(text)) == text for every covered text.
    Special ids: SPECIAL_IDS.
    Returns the loaded processor.
    """
    import sentencepiece as spm

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=0.9995,
            hard_vocab_limit=False,
            input_sentence_size=2_000_000,
            normalization_rule_name="identity",  # lossless: NFKC would turn Chinese "！" into "!"
            shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            **SPECIAL_IDS,
        )
    except RuntimeError as e:  # e.g. more distinct characters than vocab_size
        raise ValueError(f"tokenizer training failed with --vocab-size {vocab_size}: {e}") from None
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def load_tokenizer(path):
    import sentencepiece as spm

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: tokenizer model not found")
    try:
        return spm.SentencePieceProcessor(model_file=path)
    except Exception as e:  # sentencepiece raises bare RuntimeError/OSError on corrupt files
        raise ValueError(f"{path}: not a valid SentencePiece model ({e})") from None
