"""Pictures of the Transformer for the notebooks and `kformer attention`: `alignment` and
`beam_trace` run a Translator to get what a picture shows; each `*_figure` function returns a
matplotlib Figure with labelled axes and computes nothing the package does not.

Chinese token labels need a CJK font. Without one, labels show code points (U+6211) and the
figure says so (Debian/Ubuntu: `apt-get install fonts-noto-cjk`)."""

import csv
import functools

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import font_manager

from kformer.decode.options import BEAM_SIZE

CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Serif CJK SC",
    "Source Han Sans SC",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
    "SimHei",
    "Microsoft YaHei",
    "PingFang SC",
)
NO_CJK_NOTE = "(no CJK font: Chinese shown as code points;\ninstall fonts-noto-cjk for characters)"


@functools.lru_cache(maxsize=1)
def cjk_font():
    """The name of an installed font with Chinese glyphs, or None. Fonts installed after
    matplotlib built its font cache are found by scanning the system font files."""

    def known():
        installed = {f.name for f in font_manager.fontManager.ttflist}
        return next((name for name in CJK_FONTS if name in installed), None)

    if known() is None:
        for path in font_manager.findSystemFonts():
            if any(
                key in path.replace("-", "").lower()
                for key in ("notosanscjk", "wqy", "droidsansfallback", "sourcehansans")
            ):
                font_manager.fontManager.addfont(path)
    return known()


def _is_cjk(char):
    return (
        "\u2e80" <= char <= "\u9fff"
        or "\uf900" <= char <= "\ufaff"
        or "\uff00" <= char <= "\uffef"
        or "\u3000" <= char <= "\u303f"
    )


def token_labels(pieces):
    """Readable labels for SentencePiece pieces: "▁" shown as a leading space; CJK characters
    kept when a CJK font exists, else written as code points."""
    labels = []
    for piece in pieces:
        text = piece.replace("\u2581", " ").strip() or "\u2423"
        if cjk_font() is None:
            text = "".join(f" U+{ord(c):04X} " if _is_cjk(c) else c for c in text)
            text = " ".join(text.split())
        labels.append(text)
    return labels


def _figure(*args, **kwargs):
    if cjk_font():
        plt.rcParams["font.sans-serif"] = [cjk_font(), "DejaVu Sans"]
    return plt.subplots(*args, **kwargs)


def _needs_note(labels):
    return cjk_font() is None and any("U+" in label for label in labels)


def alignment(runner, text, layer=-1, options=None):
    """Translates one sentence with a KerasRunner (kformer.decode.translator; `options`: a
    SearchOptions over its own), then returns what the decoder looked at for each generated
    token: {"source": pieces, "target": pieces (ending with </s> unless cut at the length limit),
    "decoder_input": <s> + target[:-1], "translation": text,
    "weights": (T, S) cross-attention of `layer` averaged over heads,
    "attention": every layer's weights (see `Transformer.attention_weights`)}."""
    from kformer.decode.text_batches import strip_special

    config, tokenizer = runner.config, runner.tokenizer
    ids = _source_ids(runner, text)
    if not ids:
        raise ValueError("nothing to align: the text is blank or outside the model's vocabulary")
    tokens, _ = runner.search(np.array([ids], np.int32), options)
    best = (tokens[0] if tokens.ndim == 2 else tokens[0, 0]).tolist()  # the search's own output, EOS and all
    output = strip_special(best, config.eos_id, config.pad_id)
    generated = output + [config.eos_id] if config.eos_id in best else output  # EOS, or cut at the limit
    # Row t is the decoder position that produced generated[t]: its input is BOS + generated[:t].
    decoder_input = [config.bos_id] + generated[:-1]
    attention = runner.translator.model.attention_weights(
        np.array([ids], np.int32), np.array([decoder_input], np.int32)
    )
    weights = np.asarray(attention["cross"][layer])[0].mean(axis=0)  # (T, S)
    return {
        "source": [tokenizer.id_to_piece(i) for i in ids],
        "target": [tokenizer.id_to_piece(i) for i in generated],
        "decoder_input": [tokenizer.id_to_piece(i) for i in decoder_input],
        "translation": tokenizer.decode(output),
        "weights": weights,
        "attention": attention,
    }


def save_alignment(model_dir, text, path, layer=-1, beam_size=BEAM_SIZE):
    """`kformer attention`: translates `text` with the model of a training folder and writes the
    picture of its encoder-decoder alignment (`layer`, mean of heads) to `path`. Returns the translation."""
    from kformer.decode.options import SearchOptions
    from kformer.decode.translator import KerasRunner

    runner = KerasRunner.open(model_dir)
    result = alignment(runner, text, layer, SearchOptions(beam_size=beam_size))
    number = (layer if layer >= 0 else runner.config.num_decoder_layers + layer) + 1
    figure = alignment_figure(
        result["weights"],
        result["source"],
        result["target"],
        title=f"encoder-decoder attention, layer {number}, mean of heads",
    )
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return result["translation"]


def _source_ids(runner, text):
    """The token ids of one sentence, the first max_source_length (what a picture shows)."""
    return runner.tokenizer.encode(text.strip())[: runner.config.max_source_length]


def beam_trace(runner, text):
    """The beam search of one sentence by a KerasRunner, step by step: a list with, per step, the
    K alive hypotheses as (pieces, log-probability), best first (dead beams left out). It runs the
    real search loop with trace buffers in its state (`Translator.trace`): a re-implementation
    outside the loop could show a search that is not the one translating."""
    from kformer.decode.search import NEG_INF

    config, tokenizer, k = runner.config, runner.tokenizer, runner.options.beam_size
    ids = _source_ids(runner, text) or [config.pad_id]
    trace = runner.translator.trace(np.array([ids], np.int32), runner.options)
    tokens, log_probs = trace["tokens"].numpy()[0], trace["log_probs"].numpy()[0]
    return [
        [
            (
                [tokenizer.id_to_piece(int(t)) for t in tokens[step, beam, : step + 1]],
                float(log_probs[step, beam]),
            )
            for beam in range(k)
            if log_probs[step, beam] > NEG_INF / 2
        ]
        for step in range(int(trace["steps"]))
    ]


def positional_encoding_figure(length=100, d_model=128):
    """The paper's interleaved sin/cos encoding beside the concatenated sin|cos layout of early
    implementations (the same numbers, columns reordered)."""
    from kformer.model.layers import sinusoidal_table

    table = sinusoidal_table(length, d_model)
    concatenated = np.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)
    fig, axes = _figure(1, 2, figsize=(12, 4), sharey=True)
    for ax, data, title in (
        (axes[0], table, "interleaved: PE(pos, 2i) = sin, PE(pos, 2i+1) = cos (the paper)"),
        (axes[1], concatenated, "concatenated: sin | cos (early implementations)"),
    ):
        image = ax.imshow(data, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("dimension")
    axes[0].set_ylabel("position")
    fig.colorbar(image, ax=axes, shrink=0.8)
    return fig


def mask_figure(length=8):
    """The causal mask: query i may attend to keys 0..i (True = may attend)."""
    from kformer.model.masks import causal_mask

    fig, ax = _figure(figsize=(4, 4))
    ax.imshow(np.asarray(causal_mask(length))[0], cmap="Greys", vmin=0, vmax=1)
    ax.set(title="causal mask (dark = may attend)", xlabel="key position", ylabel="query position")
    return fig


def attention_figure(weights, query_pieces, key_pieces, title="attention"):
    """One panel per head. weights: (H, Tq, Tk)."""
    weights = np.asarray(weights)
    heads = weights.shape[0]
    columns = min(heads, 4)
    rows = -(-heads // columns)
    queries, keys = token_labels(query_pieces), token_labels(key_pieces)
    fig, axes = _figure(rows, columns, figsize=(3.2 * columns, 3.2 * rows), squeeze=False)
    for head, ax in enumerate(axes.flat):
        if head >= heads:
            ax.axis("off")
            continue
        ax.imshow(weights[head], cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"head {head + 1}", fontsize=9)
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
        ax.set_yticks(range(len(queries)), queries, fontsize=7)
        ax.set(xlabel="attends to", ylabel="query")
    fig.suptitle(title + (" " + NO_CJK_NOTE if _needs_note(queries + keys) else ""), fontsize=10)
    fig.tight_layout()
    return fig


def alignment_figure(weights, source_pieces, target_pieces, title="encoder-decoder attention"):
    """Source tokens across, generated tokens down, attention weights as shades. weights: (Tt, Ts)."""
    weights = np.asarray(weights)
    sources, targets = token_labels(source_pieces), token_labels(target_pieces)
    fig, ax = _figure(figsize=(max(5.0, 1.5 + 0.45 * len(sources)), max(3.5, 1.5 + 0.4 * len(targets))))
    image = ax.imshow(weights, cmap="Blues", vmin=0, vmax=max(float(weights.max()), 1e-6))
    ax.set_xticks(range(len(sources)), sources, rotation=90)
    ax.set_yticks(range(len(targets)), targets)
    ax.set(xlabel="source token", ylabel="generated token")
    ax.set_title(title + ("\n" + NO_CJK_NOTE if _needs_note(sources + targets) else ""), fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    fig.tight_layout()
    return fig


def beam_trace_figure(steps, title="beam search"):
    """The alive hypotheses after each step (from `beam_trace`), best on top, with
    their log-probabilities."""
    width = max(len(alive) for alive in steps) if steps else 1
    fig, ax = _figure(figsize=(2.2 * max(len(steps), 1), 0.6 * width + 1.2))
    labels = []
    for step, alive in enumerate(steps):
        for rank, (pieces, log_prob) in enumerate(alive):
            label = " ".join(token_labels(pieces[-3:]))
            labels.append(label)
            ax.text(
                step,
                rank,
                f"{label}\n{log_prob:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                bbox={"boxstyle": "round", "fc": "white", "ec": "grey"},
            )
    ax.set(
        xlim=(-0.6, len(steps) - 0.4),
        ylim=(width - 0.5, -0.5),
        xlabel="step (last tokens of each alive hypothesis, log-probability)",
        ylabel="beam rank",
        xticks=range(len(steps)),
        yticks=range(width),
    )
    ax.set_title(title + (" " + NO_CJK_NOTE if _needs_note(labels) else ""), fontsize=9)
    return fig


def history_figure(history):
    """Loss and token accuracy per epoch, train and validation. `history` is a Keras
    `History.history` dict or the logs/history.csv of a training folder."""
    if isinstance(history, dict):
        rows = [{"epoch": i, **{k: v[i] for k, v in history.items()}} for i in range(len(history["loss"]))]
    else:
        with open(history, newline="") as f:
            rows = list(csv.DictReader(f))
    epochs = [int(r["epoch"]) + 1 for r in rows]
    fig, axes = _figure(1, 2, figsize=(10, 3.5))
    for ax, metric, label in (
        (axes[0], "loss", "label-smoothed loss"),
        (axes[1], "token_accuracy", "token accuracy"),
    ):
        for prefix, name in (("", "train"), ("val_", "validation")):
            if rows and prefix + metric in rows[0] and rows[0][prefix + metric]:
                ax.plot(epochs, [float(r[prefix + metric]) for r in rows], marker="o", label=name)
        ax.set(xlabel="epoch", ylabel=label)
        ax.legend()
    fig.tight_layout()
    return fig


def bar_figure(values, ylabel, title):
    """values: {label: number}."""
    fig, ax = _figure(figsize=(max(4, 0.9 * len(values)), 3.5))
    ax.bar(range(len(values)), list(values.values()), color="tab:blue")
    ax.set_xticks(range(len(values)), list(values), rotation=30, ha="right")
    ax.set(ylabel=ylabel, title=title)
    fig.tight_layout()
    return fig
