"""`kformer bench alternatives`: how many distinct alternatives every runtime of an export gives
when asked for N (LibreTranslate's `alternatives=N`: the translation and N more, a search of
nbest N + 1), on everyday sentences that are not in the default corpus, and whether every runtime
gives the reference's (Keras on the training folder's weights).

A search returns nbest finished hypotheses; hypotheses that detokenize to the same text merge into
one alternative, so a sentence may still have fewer."""

import os

from kformer.arguments import positive
from kformer.bench.harness import Stopwatch, print_table, report
from kformer.contracts.export import ExportManifest
from kformer.decode.options import SearchOptions

HELP = "distinct alternatives per sentence in every runtime of an export (LibreTranslate's alternatives=N)"

# Written for this bench, none in the default corpus (tests/test_bench.py checks it).
EVERYDAY = {
    "zh": (
        "今天早上我喝了两杯咖啡。",
        "请把窗户打开一点。",
        "我的手表停了。",
        "这家饭馆的面条很好吃。",
        "明天我们几点出发？",
        "他每天骑自行车上班。",
        "我找不到我的钥匙了。",
        "外面下雨了，带把伞吧。",
        "你周末有什么计划？",
        "这本书我已经看完了。",
        "超市几点关门？",
        "我妹妹喜欢画画。",
        "我们晚上一起看电影吧。",
        "这道题我不会做。",
        "她昨天买了一条新裙子。",
        "火车晚点了半个小时。",
        "请你说慢一点。",
        "我今天感觉有点累。",
        "你会说日语吗？",
        "这个周末天气很好。",
        "他忘了关灯。",
        "我们需要更多的时间。",
        "孩子们在公园里玩。",
        "我想学游泳。",
        "这杯茶太烫了。",
        "你能帮我拿一下这个箱子吗？",
        "我的电脑坏了。",
        "我们下个月去北京旅行。",
        "他的房间总是很干净。",
        "医生说我需要多休息。",
    ),
    "en": (
        "I had two cups of coffee this morning.",
        "Please open the window a little.",
        "My phone battery is dead.",
        "The noodles at this restaurant are delicious.",
        "When do we leave tomorrow morning?",
        "He rides his bike to work every day.",
        "I can't find my keys.",
        "It's raining outside, take an umbrella.",
        "What are your plans for the weekend?",
        "I finished reading this book last night.",
        "What time does the supermarket close?",
        "My little sister likes drawing.",
        "Let's watch a movie together tonight.",
        "This question is hard to answer.",
        "She bought a new dress yesterday.",
        "The train was half an hour late.",
        "Please say that again.",
        "I feel a little tired today.",
        "Can you speak Japanese?",
        "The weather is nice this weekend.",
        "He forgot to switch off the kitchen light.",
        "We need more time.",
        "The children are playing in the park.",
        "I want to learn to swim.",
        "This tea is too hot.",
        "Can you help me carry this box?",
        "My computer is broken.",
        "We are traveling to Beijing next month.",
        "His room is always clean.",
        "The doctor said I need more rest.",
    ),
}


def runtimes(manifest):
    """(runtime, variant) of every file of the export that returns alternatives, the reference
    (keras) first where the training folder is still there. The text ONNX file returns one
    translation per text, and the Argos package is CTranslate2's file again."""
    from kformer.export.formats import FORMATS

    files = [(a.format, a.variant) for a in manifest.artifacts if a.format in FORMATS]
    keras = [("keras", "fp32")] if os.path.isdir(manifest.trained_in or "") else []
    return keras + [file for file in files if file != ("onnx", "text")]


def bench_alternatives(export_dir, alternatives=3, sentences=None):
    """Each runtime's alternatives for the `sentences` (default: EVERYDAY in the export's source
    language); a JSON-friendly dict."""
    from kformer.bench.runtimes import export_runner

    manifest = ExportManifest.load(export_dir)
    beam, nbest = manifest.beam_size, alternatives + 1
    if nbest > beam:
        raise ValueError(f"--alternatives {alternatives} needs a beam of {nbest}; this export's is {beam}")
    source = manifest.pair.source
    if sentences is None:
        if source not in EVERYDAY:
            raise ValueError(f"no everyday sentences in {source!r}: give --sentences FILE")
        sentences = list(EVERYDAY[source])
    found, reference = {}, None
    for runtime, variant in runtimes(manifest):
        runner = export_runner(runtime, export_dir, beam, variant)
        with Stopwatch() as watch:
            results = runner.translations(sentences, SearchOptions(nbest=nbest))
        texts = [[a.text for a in t.alternatives] for t in results]
        reference = texts if reference is None else reference
        found[f"{runtime} {variant}"] = {
            "full": sum(len(t) == nbest for t in texts),  # the translation and `alternatives` more
            "counts": [len(t) - 1 for t in texts],
            "as_reference": sum(a == b for a, b in zip(texts, reference)),
            "seconds": round(watch.seconds, 2),
        }
    return {
        "export": os.path.abspath(export_dir),
        "alternatives": alternatives,
        "sentences": len(sentences),
        "runtimes": found,
        "example": [sentences[0], reference[0] if reference else []],
    }


def print_alternatives_table(results):
    n, k = results["sentences"], results["alternatives"]
    columns = [
        ("runtime", "<22", "name"),
        (f"{k} distinct", ">11", lambda r: f"{r['full']:>5} / {n:<3}"),
        ("as reference", ">13", lambda r: f"{r['as_reference']:>7} / {n:<3}"),
        ("seconds", "8.2f", "seconds"),
    ]
    print_table(
        columns,
        [{"name": name, **r} for name, r in results["runtimes"].items()],
        title=f"alternatives={k} (nbest {k + 1}) on {n} sentences, {results['export']}",
    )
    source, texts = results["example"]
    print(f"e.g. {source} -> " + " | ".join(texts))


def add_arguments(p):
    p.add_argument("--model", required=True, help="a `kformer export` folder")
    p.add_argument("--alternatives", type=positive(int), default=3, help="alternatives asked for (default 3)")
    p.add_argument("--sentences", help="a file of sentences, one a line (default: 30 everyday ones)")


def main(args):
    sentences = None
    if args.sentences:
        with open(args.sentences, encoding="utf-8") as f:
            sentences = [line.rstrip("\n") for line in f if line.strip()]
    report(bench_alternatives(args.model, args.alternatives, sentences), print_alternatives_table, args.json)
