"""`kformer` command line: parse, then call one importable function. No logic of its own."""

import argparse
import json
import logging
import os
import sys

from kformer import extras
from kformer.arguments import add_precision_option, positive
from kformer.decode import gather
from kformer.decode.text_batches import BEAM_TOKENS_PER_SENTENCE, TOKENS_PER_SENTENCE
from kformer.export.formats import DEFAULT_FORMATS, FORMATS, RUNTIMES, VARIANTS
from kformer.model.config import (
    BEAM_SIZE,
    DEFAULT_DIRECTION,
    DEFAULT_PRESET,
    GATHER_WINDOW_SECONDS,
    LENGTH_PENALTY,
    MAX_INPUT_CHARS,
    NO_REPEAT_NGRAM,
    PRESETS,
    TransformerConfig,
)
from kformer.train.distributed import CONNECT_TIMEOUT_SECONDS, STRATEGIES, Preempted
from kformer.train.init_from import MIX_ORIGINAL


def _start_tensorflow(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # hides the CUDA probe noise on CPU machines
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if getattr(args, "runtime", "keras") != "keras" or args.command == "bench":
        return  # exported runtimes run without TensorFlow; bench sets XLA flags before it starts
    # TensorFlow's C++ start-up notes (oneDNN, "Could not find cuda drivers") ignore the log level
    # (abseil logs before InitializeLog; abseil-cpp PR 1718): import it once with stderr muted.
    stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        os.close(devnull)


def _averaging_momentum(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def _data_spec(values):
    if values is None or values == ["default"]:
        return "default"
    return values[0] if len(values) == 1 else tuple(values)


def _train(args):
    from kformer.train.distributed import make_strategy
    from kformer.train.fit import stop_if_interrupted, train
    from kformer.train.keep_best import Evaluation

    summary = train(
        args.out,
        args.config,
        data=_data_spec(args.data),
        direction=args.direction,
        minutes=args.minutes,
        steps=args.steps,
        epochs=args.epochs,
        xla=args.xla,
        precision=args.precision,
        batch_tokens=args.batch_tokens,
        accumulate=args.accumulate,
        seed=args.seed,
        init_from=args.init_from,
        mix_original=args.mix_original,
        strategy=make_strategy(args.strategy, args.connect_timeout),
        vocab_size=args.vocab_size,
        evaluation=Evaluation(args.eval_minutes, args.eval_steps, args.eval_sentences, args.early_stop),
        overrides=None if args.average is None else {"ema_momentum": args.average},
        checkpoint_seconds=args.save_minutes * 60,
    )
    print(json.dumps(summary, indent=2))
    stop_if_interrupted(summary)


def _prepare(args):
    from kformer.data.prepare import prepare, summary

    manifest = prepare(
        _data_spec(args.data),
        args.out,
        args.direction,
        args.vocab_size,
        dev=args.dev,
        test=args.test,
        split_size=args.split_size,
        shards=args.shards,
        sample=args.tokenizer_sample,
        seed=args.seed,
        tokenizer=args.tokenizer,
    )
    print(f"wrote {args.out}: {summary(manifest)}")


def _translate(args):
    from kformer.data import corpus as corpus_lib
    from kformer.export.formats import open_runner

    runner = open_runner(
        args.model,
        args.runtime,
        args.variant,
        beam_size=args.beam,
        batch_size=args.batch_size,
        alpha=args.alpha,
        max_length=args.max_len,
        no_repeat_ngram=args.no_repeat_ngram,
        nbest=args.nbest,
        weights=args.weights,
        threads=args.threads,
        parallel=args.parallel,
    )
    if args.text:
        batches, where = [args.text], "argument"
    else:  # stdin: what has arrived is translated when the input pauses (kformer.decode.gather), in calls
        # of up to --parallel batches, so that a file's batches run that many at once
        lines = corpus_lib.stream_lines(sys.stdin.buffer, "<stdin>")
        size = args.batch_size * args.parallel
        batches, where = gather.gathered(lines, size, GATHER_WINDOW_SECONDS), "<stdin> line"
    done = 0
    for lines in batches:
        for number, line in enumerate(lines, start=done + 1):
            if len(line) > args.max_chars:
                raise ValueError(
                    f"{where} {number} has {len(line):,} characters, more than --max-chars {args.max_chars:,}; "
                    "split it into lines or raise --max-chars"
                )
        done += len(lines)
        for result in runner.translations(lines):
            _print_translation(result, args.format, args.nbest)
        sys.stdout.flush()


def _print_translation(result, form, nbest):
    """jsonl: one JSON object per input; text: the translation, or with --nbest N the N-best list
    format of Marian and Moses, "rank ||| translation ||| score" per alternative."""
    if form == "jsonl":
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    elif nbest == 1:
        print(result.text)
    else:
        for rank, hypothesis in enumerate(result.alternatives):
            print(f"{rank} ||| {hypothesis.text} ||| {hypothesis.score:.6f}")


def _attention(args):
    from kformer import plots

    print(plots.save_alignment(args.model, args.text, args.out, layer=args.layer, beam_size=args.beam))
    print(f"wrote {args.out}")


def _export(args):
    from kformer.export.exporter import export, print_summary

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    quantize = [q.strip() for q in (args.quantize or "").split(",") if q.strip()]
    print_summary(
        export(
            args.model,
            args.out,
            formats,
            quantize,
            beam_size=args.beam,
            alpha=args.alpha,
            max_length=args.max_len,
            no_repeat_ngram=args.no_repeat_ngram,
            weights=args.weights,
        ),
        args.out,
    )


def _evaluate(args):
    from kformer.evaluate import evaluate, print_scores

    print_scores(
        evaluate(
            args.model,
            split=args.split,
            source_file=args.source,
            reference_file=args.reference,
            beam_size=args.beam,
            alpha=args.alpha,
            max_length=args.max_len,
            no_repeat_ngram=args.no_repeat_ngram,
            output=args.output,
            limit=args.limit,
            weights=args.weights,
        )
    )


def _demo(args):
    from kformer.demo import demo

    demo(args.out, args.config, args.minutes)


def _serve(args):
    from kformer.serve.limits import read_api_keys
    from kformer.serve.server import load_models, serve
    from kformer.serve.settings import Settings

    settings = Settings(
        batch_size=args.batch_size,
        window=args.batch_window_ms / 1000,
        max_queue_chars=args.max_queue_chars,
        max_body_bytes=args.max_body_bytes,
        max_chars=args.max_chars,
        api_key=args.api_key or os.environ.get("KFORMER_API_KEY") or None,
        req_limit=args.req_limit,
        api_keys=read_api_keys(args.api_keys) if args.api_keys else None,
    )
    if settings.api_key and settings.api_keys:
        raise ValueError("--api-key and --api-keys: give one key every request needs, or a file of keys")
    print(f"loading {', '.join(args.model)} ({args.runtime} {args.variant})", flush=True)
    runners, sizes = load_models(
        args.model,
        args.runtime,
        args.variant,
        threads=args.threads,
        parallel=args.parallel,
        alpha=args.alpha,
        max_length=args.max_len,
        no_repeat_ngram=args.no_repeat_ngram,
    )

    def ready(url):
        print(
            f"serving {', '.join(r.manifest['corpus']['direction'] for r in runners)} at {url} "
            "(POST /translate, /v1/translate; GET /health, /metrics)",
            flush=True,
        )
        print(f"page: {url}?runtime=onnx&variant=fp32 (litert: ?runtime=litert); Ctrl-C stops", flush=True)

    serve(runners, args.host, args.port, settings, ready, sizes)


def _add_train(commands):
    p = commands.add_parser("train", help="train (or resume) a model in --out")
    p.add_argument(
        "--config", choices=sorted(PRESETS), help=f"model and recipe preset (default: {DEFAULT_PRESET})"
    )
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="'default' (Tatoeba zh-en), a TSV of source<TAB>target or two aligned text files (each "
        "plain or gzip; prepared into the run folder), or a `kformer prepare` folder",
    )
    p.add_argument(
        "--direction",
        help="language pair source-target; picks the columns of the default corpus (zh-en or en-zh; "
        f"default: {DEFAULT_DIRECTION}, or --init-from's)",
    )
    p.add_argument("--out", required=True, help="training directory; re-running with it resumes")
    p.add_argument(
        "--init-from",
        metavar="RUN",
        help="start from this training directory's weights (fine-tuning): its tokenizer, direction "
        "and model sizes are kept, --data is encoded with its tokenizer; RUN is only read",
    )
    p.add_argument(
        "--mix-original",
        type=positive(float, zero_allowed=True),
        metavar="SHARE",
        help="with --init-from: the share of each batch's pairs drawn from RUN's own corpus, so that "
        f"the model keeps its general translation (default: {MIX_ORIGINAL}; 0: the new corpus alone)",
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=positive(float), help="stop cleanly after this much training time")
    budget.add_argument("--steps", type=positive(int), help="total optimizer steps")
    budget.add_argument("--epochs", type=positive(int), help="total passes over the train split")
    _step_options(p)
    _evaluation_options(p)
    _strategy_options(p)
    p.set_defaults(run=_train)


def _step_options(p):
    """What a training step computes: XLA, precision, batch, accumulation, averaging; and when it saves."""
    p.add_argument(
        "--xla",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the train step with XLA (default: on with a GPU, no --strategy and no --minutes "
        "under 30; off on CPUs, where it compiles each batch shape for no measured gain)",
    )
    add_precision_option(p)
    p.add_argument(
        "--batch-tokens",
        type=positive(int),
        help="tokens per optimizer step and side (default: the preset's)",
    )
    p.add_argument(
        "--accumulate",
        type=positive(int),
        metavar="N",
        help="each optimizer step averages the gradients of N batches of batch-tokens / N tokens: "
        "a large batch in the memory of a small one (default: the preset's, 1)",
    )
    p.add_argument(
        "--average",
        type=_averaging_momentum,
        metavar="MOMENTUM",
        help="translate with a moving average of the weights (e.g. 0.995; 0: off; default: the "
        "preset's: 0.995 for small, off for the others)",
    )
    p.add_argument(
        "--vocab-size",
        type=positive(int),
        default=TransformerConfig.vocab_size,
        help="SentencePiece vocabulary size",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--save-minutes",
        type=positive(float),
        default=5.0,
        help="save model.keras (and where the batch stream is) this often, and at the end; a kill "
        "loses at most this much training (default: %(default)s)",
    )


def _strategy_options(p):
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="default",
        help="mirrored: data-parallel over the local accelerators; multi-worker: over the "
        "workers of TF_CONFIG (run the same command on each, --out on storage every worker reads)",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive(float),
        default=CONNECT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="multi-worker: give up if the other workers are not all reachable by then",
    )


def _evaluation_options(p):
    from kformer.model.config import EVAL_MINUTES, EVAL_SENTENCES

    group = p.add_argument_group(
        "keeping the best weights (best.weights.h5, used by translate/evaluate/export)"
    )
    group.add_argument(
        "--eval-minutes",
        type=positive(float, zero_allowed=True),
        default=EVAL_MINUTES,
        help="translate a dev sample (greedy) and score it this often; 0: never (default: %(default)s)",
    )
    group.add_argument("--eval-steps", type=positive(int), help="evaluate every N optimizer steps instead")
    group.add_argument(
        "--eval-sentences",
        type=positive(int),
        default=EVAL_SENTENCES,
        help="dev sources an evaluation translates (default: %(default)s)",
    )
    group.add_argument(
        "--early-stop",
        type=positive(int),
        metavar="N",
        help="stop after N evaluations without a BLEU gain",
    )


def _threads_options(p, what_parallel_does):
    """--threads and --parallel (kformer.export.runner.ArtifactRunner) of a command that runs an export."""
    p.add_argument("--threads", type=positive(int), help="the runtime's threads (default: all cores)")
    p.add_argument(
        "--parallel",
        type=positive(int),
        default=1,
        metavar="N",
        help=f"batches run at once, each on threads / N threads: {what_parallel_does} "
        "(onnx ids variants and ctranslate2; default 1)",
    )


def _weights_option(p):
    from kformer.run_folder import WEIGHTS

    p.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="best",
        help="best: best.weights.h5 where training kept one (else model.keras); last: model.keras",
    )


def _add_prepare(commands):
    from kformer.data import prepare

    p = commands.add_parser(
        "prepare", help="a corpus of any size into a folder that training reads as a stream"
    )
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="'default' (Tatoeba zh-en), a TSV of source<TAB>target, or two aligned text files; each plain or gzip",
    )
    p.add_argument("--out", required=True, help="new folder for the prepared corpus")
    p.add_argument("--direction", default=DEFAULT_DIRECTION, help="language pair source-target")
    p.add_argument("--vocab-size", type=positive(int), default=TransformerConfig.vocab_size)
    p.add_argument("--dev", metavar="TSV", help="the dev split from this file instead of from the corpus")
    p.add_argument("--test", metavar="TSV", help="the test split from this file instead of from the corpus")
    p.add_argument(
        "--split-size",
        type=positive(int),
        default=prepare.SPLIT_SIZE,
        help="pairs at most in the dev and in the test split taken from the corpus",
    )
    p.add_argument(
        "--shards", type=positive(int), help=f"train shards (default: one per {prepare.SHARD_PAIRS:,} pairs)"
    )
    p.add_argument(
        "--tokenizer-sample",
        type=positive(int),
        default=prepare.TOKENIZER_SAMPLE,
        help="train pairs the tokenizer is trained on, at most",
    )
    p.add_argument(
        "--tokenizer",
        metavar="MODEL",
        help="encode with this SentencePiece model (e.g. a run's tokenizer.model, to fine-tune it "
        "with --init-from) instead of training one",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=_prepare)


def _add_translate(commands):
    p = commands.add_parser("translate", help="translate TEXT arguments, or stdin one sentence per line")
    p.add_argument("--model", required=True, help="training directory, or an export folder with --runtime")
    p.add_argument("--runtime", default="keras", choices=RUNTIMES)
    p.add_argument(
        "--variant",
        default="fp32",
        choices=sorted({v for vs in VARIANTS.values() for v in vs}),
        help="tflite: fp32/fp16/int8, or fixed (input shape fixed, for LiteRT.js); "
        "onnx: fp32/int8 (int8: the export's int8-ort file, onnxruntime's own int8 kernels, where it "
        "has one; the portable int8 file is the page's), or text (SentencePiece inside the graph)",
    )
    p.add_argument(
        "--beam", type=positive(int), help=f"beam size (1 = greedy; default {BEAM_SIZE}, or the export's)"
    )
    _add_search_options(p, defaults=None, where="or the export's")
    p.add_argument(
        "--nbest", type=positive(int), default=1, help="alternatives per input (at most the beam size)"
    )
    p.add_argument(
        "--format",
        default="text",
        choices=["text", "jsonl"],
        help="text: one line per input (with --nbest: 'rank ||| translation ||| score' lines); "
        'jsonl: {"translation", "score", "alternatives"} per input',
    )
    p.add_argument(
        "--max-chars",
        type=positive(int),
        default=MAX_INPUT_CHARS,
        help=f"longest input line accepted, in characters (default {MAX_INPUT_CHARS:,})",
    )
    p.add_argument(
        "--batch-size",
        type=positive(int),
        default=32,
        help="most lines (and sentences) translated together (greedy: fewer long ones, at most "
        f"{TOKENS_PER_SENTENCE} source tokens a sentence; beam in ONNX and TFLite: at most "
        f"{BEAM_TOKENS_PER_SENTENCE}; a beam of K takes K of 2 x batch-size places in the TFLite graphs); "
        "a pipe's lines "
        "are translated as they arrive, those that arrive together in one batch (default 32)",
    )
    _threads_options(p, "more sentences a second on a file, slower single sentences")
    _weights_option(p)
    p.add_argument("text", nargs="*")
    p.set_defaults(run=_translate)


def _add_search_options(p, defaults, where):
    """--alpha, --max-len and --no-repeat-ngram (kformer.decode.options), with their defaults unless
    `defaults` is None (then the runner's own apply)."""

    def default(value):
        return value if defaults else None

    where = f"; {where}" if where else ""
    p.add_argument(
        "--alpha",
        type=positive(float, zero_allowed=True),
        default=default(LENGTH_PENALTY),
        help=f"length penalty exponent of beam search (default {LENGTH_PENALTY}{where})",
    )
    p.add_argument(
        "--max-len", type=positive(int), help=f"maximum output tokens (default: the model's maximum{where})"
    )
    p.add_argument(
        "--no-repeat-ngram",
        type=positive(int, zero_allowed=True),
        default=default(NO_REPEAT_NGRAM),
        metavar="N",
        help=f"never output an n-gram of N tokens twice; 0 = off (default {NO_REPEAT_NGRAM}{where})",
    )


def _add_attention(commands):
    p = commands.add_parser("attention", help="picture of the encoder-decoder alignment for a sentence (PNG)")
    p.add_argument("--model", required=True, help="training directory")
    p.add_argument("--out", default="alignment.png")
    p.add_argument("--layer", type=int, default=-1, help="decoder layer (default: the last)")
    p.add_argument("--beam", type=positive(int), default=BEAM_SIZE)
    p.add_argument("text")
    p.set_defaults(run=_attention)


def _add_export(commands):
    p = commands.add_parser(
        "export", help="write SavedModel, TFLite and ONNX (and CTranslate2) translators, verified"
    )
    p.add_argument("--model", required=True, help="training directory")
    p.add_argument("--out", required=True, help="new folder for the artifacts")
    p.add_argument(
        "--formats",
        default=",".join(DEFAULT_FORMATS),
        help=f"comma list of {','.join(FORMATS)},argos (ctranslate2 and argos, an Argos Translate "
        "package of the ctranslate2 model: pip install 'kformer[ctranslate2]')",
    )
    p.add_argument(
        "--quantize",
        default="",
        help="comma list of fp16,int8 (extra variants; int8 also makes the Argos package int8)",
    )
    _weights_option(p)
    p.add_argument(
        "--beam", type=positive(int), default=BEAM_SIZE, help="beam size of the exported beam search"
    )
    _add_search_options(p, defaults=True, where="the files' default; any value at run time")
    p.set_defaults(run=_export)


def _add_evaluate(commands):
    p = commands.add_parser("evaluate", help="BLEU and chrF on a held-out split or on files")
    p.add_argument("--model", required=True, help="training directory")
    p.add_argument("--split", default="test", choices=["test", "dev"])
    p.add_argument("--source", help="source sentences, one per line (with --reference)")
    p.add_argument("--reference", help="reference translations, one per line")
    p.add_argument("--beam", type=positive(int), default=BEAM_SIZE)
    _add_search_options(p, defaults=True, where="")
    p.add_argument("--output", help="hypotheses file (default: MODEL/hypotheses.<split>.txt)")
    p.add_argument("--limit", type=positive(int), help="only the first N sentences")
    _weights_option(p)
    p.set_defaults(run=_evaluate)


def _add_demo(commands):
    p = commands.add_parser("demo", help="train on the default corpus, report BLEU, show translations")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--config", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    p.add_argument("--minutes", type=positive(float), default=20)
    p.set_defaults(run=_demo)


def _add_serve(commands):
    from kformer.serve.settings import Settings

    p = commands.add_parser(
        "serve", help="HTTP translation server on an export (kformer's and LibreTranslate's APIs, the page)"
    )
    p.add_argument(
        "--model",
        required=True,
        action="append",
        help="export folder, or a folder of them; repeat for more language pairs (one model a pair)",
    )
    p.add_argument("--runtime", default="onnx", choices=["onnx", "tflite", "ctranslate2"])
    p.add_argument(
        "--variant", default="fp32", choices=sorted({v for names in VARIANTS.values() for v in names})
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=positive(int, zero_allowed=True), default=8000, help="0: any free port")
    p.add_argument(
        "--api-key",
        help="require this key (LibreTranslate's api_key field or Authorization: "
        "Bearer); default $KFORMER_API_KEY, else none",
    )
    p.add_argument(
        "--api-keys",
        metavar="FILE",
        help="API keys, one a line, each optionally with its own requests per minute ('KEY 120'); "
        "requests without a key get --req-limit",
    )
    p.add_argument(
        "--req-limit",
        type=positive(int),
        help="requests per minute per client (its key, else its address); 429 above (default: none)",
    )
    _threads_options(p, "more sentences a second under load, a lone request slower")
    defaults = Settings()
    p.add_argument(
        "--batch-size",
        type=positive(int),
        default=defaults.batch_size,
        help=f"texts gathered into one runner call, a request whole (default {defaults.batch_size})",
    )
    p.add_argument(
        "--batch-window-ms",
        type=positive(float, zero_allowed=True),
        default=defaults.window * 1000,
        help=f"how long a batch waits for more requests (default {defaults.window * 1000:g})",
    )
    p.add_argument(
        "--max-queue-chars",
        type=positive(int),
        default=defaults.max_queue_chars,
        help=f"characters waiting beyond which requests get 503 (default {defaults.max_queue_chars:,})",
    )
    p.add_argument(
        "--max-chars",
        "--char-limit",
        type=positive(int),
        default=defaults.max_chars,
        help=f"most characters in one request (413 above; default {defaults.max_chars:,})",
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive(int),
        default=defaults.max_body_bytes,
        help=f"largest request body (413 above; default {defaults.max_body_bytes:,})",
    )
    _add_search_options(p, defaults=None, where="the export's; a request may choose its own")
    p.set_defaults(run=_serve)


def _add_bench(commands):
    import importlib

    from kformer import bench

    p = commands.add_parser("bench", help="benchmarks: ratios measured in one run")
    benchmarks = p.add_subparsers(dest="what", required=True, metavar="BENCHMARK")
    for name in bench.BENCHMARKS:
        module = importlib.import_module(f"kformer.bench.{name}")
        b = benchmarks.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(b)
        b.add_argument("--json", help="also write the results to this file")
        b.set_defaults(run=module.main)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="kformer", description="Train, translate with and export encoder-decoder Transformers."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_prepare,
        _add_train,
        _add_translate,
        _add_attention,
        _add_export,
        _add_evaluate,
        _add_demo,
        _add_serve,
        _add_bench,
    ):
        add(commands)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    _start_tensorflow(args)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kformer: %(message)s"))
    log = logging.getLogger("kformer")
    log.addHandler(handler)
    level, propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # converters are chatty at INFO/WARNING
    from kformer.export.format import ExportError

    try:
        args.run(args)
    except Preempted as e:  # saved: the same command resumes
        print(f"kformer {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except (ValueError, OSError, FloatingPointError, ExportError) as e:
        # User errors (CorpusError and ArtifactError are ValueErrors; OSError: a path that is a folder,
        # not writable or full; FloatingPointError: a NaN loss) are one line; a bug keeps its traceback.
        print(f"kformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # an optional extra not installed is a user error too
        if e.name is None or extras.extra_for(e.name) is None:
            raise
        print(f"kformer {args.command}: error: {extras.missing(e.name, 'this command')}", file=sys.stderr)
        return 2
    finally:  # as it was: a caller's next `main` (a test's, a notebook's) gets its own stderr
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
    return 0


if __name__ == "__main__":
    sys.exit(main())
