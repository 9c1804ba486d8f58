"""The reference side of the Marian import tests, run with the `transformers` venv's Python (it
has torch and transformers; kformer's venv has neither):

    python marian_reference.py build OUT PAIRS.tsv SETTINGS.json   a small MarianMTModel folder,
        trained a few hundred steps on the pairs, with source.spm, target.spm and vocab.json
        trained on them, saved with save_pretrained as OPUS-MT folders are
    python marian_reference.py greedy FOLDER < SOURCES.json      transformers' greedy ids
    python marian_reference.py random OUT SETTINGS.json         random weights of OPUS-MT's shapes
    python marian_reference.py first_logits FOLDER < IDS.json     the first decoder step's logits
    python marian_reference.py training_rows FOLDER < PAIRS.json  what Marian trains on, and its loss
    python marian_reference.py convert FOLDER OUT                 CTranslate2's converter of the folder
    python marian_reference.py decode FOLDER < IDS.json           MarianTokenizer's text of id rows

Prints JSON on its last line."""

import io
import json
import os
import sys

import numpy as np
import sentencepiece as spm
import torch
from transformers import MarianConfig, MarianMTModel, MarianTokenizer


def _spm(texts, size, path):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=size, model_type="unigram",
        character_coverage=0.995, hard_vocab_limit=False, minloglevel=2, bos_id=-1, eos_id=-1, pad_id=-1,
    )  # fmt: skip
    with open(path, "wb") as f:
        f.write(model.getvalue())
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def _vocabulary(out, source, target, languages):
    """vocab.json as Marian's conversion writes it: </s> 0, <unk> 1, the pieces of both models
    (and the multilingual language codes), <pad> last."""
    pieces = ["</s>", "<unk>", *languages]
    for model in (source, target):
        pieces += [
            model.id_to_piece(i) for i in range(model.get_piece_size()) if model.id_to_piece(i) != "<unk>"
        ]
    pieces = list(dict.fromkeys(pieces)) + ["<pad>"]
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({piece: i for i, piece in enumerate(pieces)}, f, ensure_ascii=False)
    return len(pieces)


def build(out, pairs_path, settings_path):
    settings = json.load(open(settings_path))
    pairs = [line.rstrip("\n").split("\t") for line in open(pairs_path, encoding="utf-8")]
    os.makedirs(out, exist_ok=True)
    source = _spm([s for s, _ in pairs], settings["source_pieces"], os.path.join(out, "source.spm"))
    target = _spm([t for _, t in pairs], settings["target_pieces"], os.path.join(out, "target.spm"))
    languages = settings.get("languages", [])
    size = _vocabulary(out, source, target, languages)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"source_lang": settings["source_lang"], "target_lang": settings["target_lang"]}, f)
    config = MarianConfig(
        vocab_size=size, decoder_vocab_size=size, pad_token_id=size - 1, decoder_start_token_id=size - 1,
        eos_token_id=0, forced_eos_token_id=0, **settings["model"],
    )  # fmt: skip
    torch.manual_seed(settings.get("seed", 0))
    model = MarianMTModel(config)
    _start_from_zero(model)
    tokenizer = MarianTokenizer(
        os.path.join(out, "source.spm"), os.path.join(out, "target.spm"), os.path.join(out, "vocab.json")
    )
    _train(model, tokenizer, pairs, settings, languages)
    if settings.get("logits_bias"):  # a non-zero final_logits_bias, as some conversions carry
        generator = torch.Generator().manual_seed(1)
        model.final_logits_bias.copy_(0.5 * torch.randn(model.final_logits_bias.shape, generator=generator))
    model.save_pretrained(out)
    print(json.dumps({"vocab_size": size}))


def _start_from_zero(model):
    """Marian starts its decoder from a zero embedding, which OPUS-MT's conversions carry as a zero
    <pad> row (CTranslate2's converter starts from zeros and drops that row): zeroed, and its
    gradient too, so that training keeps it so."""
    pad = model.config.pad_token_id
    weight = model.model.shared.weight  # tied: the encoder's, the decoder's and the output's
    with torch.no_grad():
        weight[pad].zero_()
    weight.register_hook(lambda grad: grad.index_fill(0, torch.tensor([pad]), 0.0))


def _train(model, tokenizer, pairs, settings, languages):
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.get("learning_rate", 3e-3))
    rng = np.random.default_rng(0)
    model.train()
    for _ in range(settings["steps"]):
        batch = [pairs[i] for i in rng.integers(len(pairs), size=settings.get("batch", 32))]
        sources = [
            (languages[i % len(languages)] + " " if languages else "") + s for i, (s, _) in enumerate(batch)
        ]
        inputs = tokenizer(
            sources,
            text_target=[t for _, t in batch],
            padding=True,
            truncation=True,
            max_length=48,
            return_tensors="pt",
        )
        inputs["labels"][inputs["labels"] == tokenizer.pad_token_id] = -100
        loss = model(**inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def random(out, settings_path):
    """A MarianMTModel of random weights and OPUS-MT's shapes (settings: "model" and "vocab_size"),
    its vocabulary made up, with small SentencePiece models (its tests feed ids, not text). With
    "texts" (a file, a sentence a line) and "pieces", both models are trained on those sentences
    and the vocabulary starts with their pieces, so that text reaches the model (the benchmarks)."""
    settings = json.load(open(settings_path))
    size = settings["vocab_size"]
    os.makedirs(out, exist_ok=True)
    texts, count = ["a b c d e f g h i j k l m n o p", "q r s t u v w x y z"] * 10, 40
    if "texts" in settings:
        texts, count = open(settings["texts"], encoding="utf-8").read().splitlines(), settings["pieces"]
    known = []
    for name in ("source.spm", "target.spm"):
        model = _spm(texts, count, os.path.join(out, name))
        known += [model.id_to_piece(i) for i in range(model.get_piece_size())]
    known = (
        [p for p in dict.fromkeys(known) if p not in ("<unk>", "<s>", "</s>")] if "texts" in settings else []
    )
    pieces = ["</s>", "<unk>", *known, *(f"\u2581w{i}" for i in range(size - 3 - len(known))), "<pad>"]
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({piece: i for i, piece in enumerate(pieces)}, f, ensure_ascii=False)
    config = MarianConfig(
        vocab_size=size, decoder_vocab_size=size, pad_token_id=size - 1, decoder_start_token_id=size - 1,
        eos_token_id=0, **settings["model"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config)
    _start_from_zero(model)
    with torch.no_grad():  # trained models' logits biases and norms are not their initial zeros and ones
        model.final_logits_bias.normal_(0, 0.5)
        if known:  # outputs of pieces the target model has: text files decode them as Python does
            model.final_logits_bias[0, 2 + len(known) : size - 1] = -30.0
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(out)
    print(json.dumps({"vocab_size": size}))


def first_logits(folder):
    """The first decoder step's logits (from the start token) of each row of source ids (Marian
    ids, EOS included), rows padded, by Marian id."""
    model = MarianMTModel.from_pretrained(folder).eval()
    rows = json.load(sys.stdin)
    pad = model.config.pad_token_id
    width = max(map(len, rows))
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    with torch.no_grad():
        start = torch.full((len(rows), 1), model.config.decoder_start_token_id)
        values = model(input_ids=ids, attention_mask=(ids != pad).long(), decoder_input_ids=start).logits[
            :, 0
        ]
    print(json.dumps(values.tolist()))


def training_rows(folder):
    """What Marian trains on for each [source, target] pair: {"input_ids", "labels",
    "decoder_input_ids", "loss"} per pair (the tokenizer's, the model's shift of the labels, and
    the mean token cross-entropy without smoothing, over every piece but pad), one pair at a time so
    no padding enters."""
    model, tokenizer = _model(folder)
    rows = {"input_ids": [], "labels": [], "decoder_input_ids": [], "loss": []}
    with torch.no_grad():
        for source, target in json.load(sys.stdin):
            inputs = tokenizer([source], text_target=[target], return_tensors="pt")
            decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=inputs["labels"])
            # Marian's softmax has no pad (the conversion appends a zero row whose logit transformers'
            # loss counts): left out, as generate's bad_words_ids and kformer leave it out.
            logits = model(**inputs).logits[0]
            logits[:, model.config.pad_token_id] = -float("inf")
            loss = torch.nn.functional.cross_entropy(logits, inputs["labels"][0])
            rows["input_ids"].append(inputs["input_ids"][0].tolist())
            rows["labels"].append(inputs["labels"][0].tolist())
            rows["decoder_input_ids"].append(decoder_input_ids[0].tolist())
            rows["loss"].append(float(loss))
    print(json.dumps(rows))


def decode(folder):
    """MarianTokenizer.decode of each row of Marian ids (special tokens skipped)."""
    tokenizer = MarianTokenizer.from_pretrained(folder)
    rows = json.load(sys.stdin)
    print(
        json.dumps(
            [
                tokenizer.decode(row, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                for row in rows
            ]
        )
    )


def convert(folder, out):
    """CTranslate2's own converter of the folder (what `ct2-transformers-converter` runs)."""
    import ctranslate2

    ctranslate2.converters.TransformersConverter(folder).convert(out)
    print(json.dumps({"converted": out}))


def _model(folder):
    tokenizer = MarianTokenizer.from_pretrained(folder)
    return MarianMTModel.from_pretrained(folder).eval(), tokenizer


def greedy(folder):
    """{"input_ids": each source's ids, "output_ids": generate's greedy ids, without the start}: at
    most the source's length + 50 tokens, and no more than the decoder's positions hold (kformer's
    output limit), the last forced to EOS (forced_eos_token_id) where a row reaches it."""
    model, tokenizer = _model(folder)
    sources = json.load(sys.stdin)
    result = {"input_ids": [], "output_ids": []}
    positions = model.config.max_position_embeddings - 1  # the start token takes position 0
    with torch.no_grad():
        for source in sources:  # one at a time: no padding decides anything
            inputs = tokenizer([source], return_tensors="pt")
            limit = min(inputs["input_ids"].shape[1] + 50, positions)
            output = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=limit)
            result["input_ids"].append(inputs["input_ids"][0].tolist())
            result["output_ids"].append(output[0, 1:].tolist())
    print(json.dumps(result))


if __name__ == "__main__":
    commands = {
        "build": build, "greedy": greedy, "random": random, "first_logits": first_logits,
        "training_rows": training_rows, "convert": convert,
        "decode": decode,
    }  # fmt: skip
    commands[sys.argv[1]](*sys.argv[2:])
