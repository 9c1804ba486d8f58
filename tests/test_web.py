"""The page of export/web/: its tokenizer against sentencepiece (in Node), its server, and its
translations in a real browser (Debian's Chromium, driven by Playwright) against onnxruntime in
Python on the same export. Without Node or Chromium these tests skip, saying why; in CI
(CI=true) a missing tool fails them instead."""

import json
import os
import random
import shutil
import urllib.error
import urllib.request

import pytest
from conftest import BEAM, MAX_LENGTH, manifest_edited, need, need_packages, run_process

from kformer.data import corpus as corpus_lib
from kformer.data import prepare as prepare_lib
from kformer.decode.options import SearchOptions
from kformer.export import page as web
from kformer.export import tflite
from kformer.export.formats import open_listed, open_runner
from kformer.serve.app import create_app, page_app
from kformer.serve.server import serving, serving_page

NODE = shutil.which("node")
TOKENIZER_JS = os.path.join(web.WEB_DIR, "sentencepiece.js")
VOCABULARY_JS = os.path.join(web.WEB_DIR, "vocabulary.js")


def split_sentences():
    pairs, _ = corpus_lib.read_corpus()
    return prepare_lib.split_pairs(pairs)["test"]


def node_tokenize(model_path, texts, ids, tmp_path, target=None):
    """(ids of each text, text of each id list) from export/web/sentencepiece.js, run by Node."""
    ran = node_tokenizer(model_path, texts, ids, tmp_path, target)
    assert ran.status == 0, ran.stderr[-2000:]
    return json.loads(ran.stdout)


def node_tokenizer(model_path, texts, ids, tmp_path, target=None):
    """The finished Node process (conftest.Ran) of `node_tokenize`: `model_path` a SentencePiece
    model, or the tokenizer.json of a vocabulary tokenizer (export/web/vocabulary.js), for the
    target language `target` where given."""
    need(NODE, "node not found: the page's tokenizer is checked with Node")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"texts": texts, "ids": ids, "target": target}), encoding="utf-8")
    script = (
        "import { readFileSync } from 'node:fs'; import { dirname, join } from 'node:path';"
        f"import {{ SentencePiece }} from {json.dumps(TOKENIZER_JS)};"
        f"import {{ VocabularyTokenizer }} from {json.dumps(VOCABULARY_JS)};"
        "const [model, input] = process.argv.slice(1);"
        "const bytes = (file) => new Uint8Array(readFileSync(join(dirname(model), file)));"
        "let sp;"
        "if (model.endsWith('.json')) {"
        "  const record = JSON.parse(readFileSync(model, 'utf8'));"
        "  const pieces = JSON.parse(new TextDecoder().decode(bytes(record.vocabulary.file)));"
        "  sp = new VocabularyTokenizer(record, new SentencePiece(bytes(record.source.file)),"
        "                               new SentencePiece(bytes(record.target.file)), pieces);"
        "} else sp = new SentencePiece(new Uint8Array(readFileSync(model)));"
        "const job = JSON.parse(readFileSync(input, 'utf8'));"
        "if (job.target) sp = sp.forTarget(job.target);"
        "console.log(JSON.stringify([job.texts.map((t) => sp.encode(t)), job.ids.map((i) => sp.decode(i))]));"
    )
    return run_process([NODE, "--input-type=module", "-e", script, model_path, str(job)])


def test_tokenizer_matches_sentencepiece_on_the_test_split(tokenizer, tmp_path):
    """Ids identical on every sentence of the test split (both languages; this small vocabulary
    leaves many characters unknown), on odd spacing and unknown runs; decoding identical on random ids."""
    model = tmp_path / "tokenizer.model"
    model.write_bytes(tokenizer.serialized_model_proto())
    texts = [text for pair in split_sentences() for text in pair]
    texts += ["", "  Tom   is  here ", "😀😀 x 😀", "\u2581abc", "tab\there", "中文 😀😀 中"]
    rng = random.Random(0)
    ids = [[rng.randrange(tokenizer.get_piece_size()) for _ in range(rng.randrange(12))] for _ in range(3000)]
    ids += [[1], [1, 1, 5], [2, 3, 0], []]
    encoded, decoded = node_tokenize(str(model), texts, ids, tmp_path)
    assert len(texts) > 2000
    assert [t for t, e in zip(texts, encoded) if tokenizer.encode(t) != e] == []
    assert sum(tokenizer.unk_id() in e for e in encoded) > 100  # the unknown-character path is exercised
    assert [i for i, d in zip(ids, decoded) if tokenizer.decode(i) != d] == []


# What NFKC changes or SentencePiece treats apart: full-width and half-width forms, ligatures,
# circled and squared signs, composed and decomposed accents, the Kelvin and Angstrom signs,
# Unicode spaces and controls, emoji, astral CJK, "▁" itself.
AWKWARD = [
    "ＡＢＣ１２３！？　ｶﾀｶﾅ",
    "ﬁnal ﬂow ①②③ ㍻ ㎏ ™ ½",
    "cafe\u0301 café Å Å K",
    "\u3000 lead\u00a0nbsp\u2003em\u200bzw\ufeffbom trail \u3000",
    "tab\there\x0bvt\x1fus \x7f del",
    "😀😀 x 😀 👍🏽 🇫🇷",
    "\U00020000\U0002a6d6 中文 𠀀",
    "\u2581abc \u2581 ▁▁x▁",
    "  Tom   is  here ",
    "",
    " ",
    "Ｔｏｍ　ｉｓ　ｈｅｒｅ．",
    "我們試試看！他很高興。",
]


def nfkc_texts(rng):
    """The test split's sentences (both sides), the awkward inputs, and 2,000 random strings drawn
    from characters NFKC maps or SentencePiece treats apart."""
    texts = [text for pair in split_sentences() for text in pair] + AWKWARD
    pool = "".join(AWKWARD) + "ａｚＡＺ０９ｧｱﾞﾟ\u0300\u0308\u3099 \t\n\r\u00ad\u2028\u00b5\u03bcµ"
    texts += ["".join(rng.choice(pool) for _ in range(rng.randrange(1, 16))) for _ in range(2000)]
    return texts


def nfkc_model(texts, size, path):
    """A SentencePiece model trained with sentencepiece's defaults (nmt_nfkc, as OPUS-MT's)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=size, minloglevel=2,
        character_coverage=0.995, hard_vocab_limit=False,
    )  # fmt: skip
    path.write_bytes(model.getvalue())
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def test_tokenizer_normalizes_as_sentencepiece_with_a_character_map(tmp_path):
    """A model with nmt_nfkc normalization (OPUS-MT's): ids identical on the test split, the
    awkward inputs and 2,000 random strings of characters NFKC changes; decoding identical."""
    sources = [s for s, _ in split_sentences()]
    model = nfkc_model(sources, 2000, tmp_path / "nfkc.model")
    assert model.normalize("ＡＢＣ１２３") == "▁ABC123"  # the rule the test is about is in force
    rng = random.Random(1)
    texts = nfkc_texts(rng)
    ids = [[rng.randrange(model.get_piece_size()) for _ in range(rng.randrange(12))] for _ in range(2000)]
    encoded, decoded = node_tokenize(str(tmp_path / "nfkc.model"), texts, ids, tmp_path)
    assert [t for t, e in zip(texts, encoded) if model.encode(t) != e] == []
    assert sum(t.strip() != model.normalize(t).replace("▁", " ").strip() for t in texts) > 1000
    assert [i for i, d in zip(ids, decoded) if model.decode(i) != d] == []


def test_vocabulary_tokenizer_gives_the_python_tokenizers_ids_and_text(tmp_path):
    """An imported model's tokenizer (source and target NFKC models, a vocabulary of both, EOS
    appended, >>xxx<< codes): the page's ids and texts equal kformer.data.vocabulary's on the test
    split, the awkward inputs, random strings and random ids (pieces of either model)."""
    from kformer.data import vocabulary as vocabulary_lib

    pairs = split_sentences()
    source = nfkc_model([s for s, _ in pairs], 2000, tmp_path / "source.spm")
    target = nfkc_model([t for _, t in pairs], 500, tmp_path / "target.spm")
    pieces = ["</s>", "<unk>", ">>eng<<", ">>fra<<"]
    for model in (source, target):
        pieces += [model.id_to_piece(i) for i in range(model.get_piece_size())]
    pieces = [*dict.fromkeys(p for p in pieces if p not in ("<s>",)), "<pad>"]
    special = {"pad_id": len(pieces) - 1, "unk_id": 1, "bos_id": len(pieces) - 1, "eos_id": 0}
    folder = tmp_path / "vocabulary"
    folder.mkdir()
    files = [(tmp_path / name).read_bytes() for name in ("source.spm", "target.spm")]
    vocabulary_lib.write(str(folder), *files, pieces, special)
    tokenizer = vocabulary_lib.load(str(folder))
    rng = random.Random(2)
    texts = nfkc_texts(rng) + [">>fra<< 我們試試看！", ">>eng<<他很高興。", ">>xyz<< 好", ">> 好 <<", "<<>>"]
    ids = [[rng.randrange(len(pieces)) for _ in range(rng.randrange(12))] for _ in range(2000)]
    encoded, decoded = node_tokenize(str(folder / "tokenizer.json"), texts, ids, tmp_path)
    assert [t for t, e in zip(texts, encoded) if tokenizer.encode(t) != e] == []
    assert [i for i, d in zip(ids, decoded) if tokenizer.decode(i) != d] == []
    assert encoded[-5][0] == pieces.index(">>fra<<") and encoded[-5][-1] == 0  # the code, then EOS
    for_english, _ = node_tokenize(str(folder / "tokenizer.json"), texts, [], tmp_path, target="eng")
    english = tokenizer.for_target("eng")
    assert [t for t, e in zip(texts, for_english) if english.encode(t) != e] == []
    assert for_english[0][0] == pieces.index(">>eng<<") and for_english[-5][0] == pieces.index(">>fra<<")


def test_tokenizer_refuses_what_it_cannot_read(tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["a b c d e f"] * 50),
        model_prefix=str(tmp_path / "bpe"),
        vocab_size=12,
        model_type="bpe",
        minloglevel=2,
    )
    refused = node_tokenizer(str(tmp_path / "bpe.model"), ["a"], [], tmp_path)
    assert refused.status != 0 and "model type 2 is not unigram" in refused.stderr


def fetch(url):
    try:
        with urllib.request.urlopen(url) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, b""


def test_server_serves_the_page_model_and_runtime_only(artifacts):
    need_packages()
    with serving_page(artifacts) as url:
        root = url.split("?")[0]
        status, headers, body = fetch(url)
        assert status == 200 and b"kformer.js" in body
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert fetch(root + "model/manifest.json")[0] == 200
        for runtime_file in ("ort/ort-wasm-simd-threaded.wasm", "litert/wasm/litert_wasm_internal.wasm"):
            status, headers, _ = fetch(root + runtime_file)
            assert status == 200 and headers["Content-Type"] == "application/wasm", runtime_file
        for outside in (
            "model/../../etc/passwd",
            "package.json",
            "node_modules/onnxruntime-web/package.json",
            "model/",
        ):
            assert fetch(root + outside)[0] == 404, outside


@pytest.fixture(scope="module")
def two_pairs(artifacts, tokenizer, tmp_path_factory):
    """ONNX runners of two different random models, zh-en (`artifacts`) and en-zh."""
    from conftest import write_random_model

    from kformer.export.exporter import export

    model = write_random_model(tmp_path_factory.mktemp("en_zh_model"), tokenizer, "en-zh", seed=4)
    out = str(tmp_path_factory.mktemp("en_zh") / "art")
    options = SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH)
    export(model, out, ("onnx",), options=options, progress=lambda *a, **k: None)
    return {"zh-en": open_runner(artifacts, "onnx"), "en-zh": open_runner(out, "onnx")}


def test_server_serves_each_pairs_export_for_the_page(two_pairs):
    need_packages()
    with serving(create_app(list(two_pairs.values()))) as root:
        for path, direction in (("model/", "zh-en"), ("models/zh-en/", "zh-en"), ("models/en-zh/", "en-zh")):
            status, headers, body = fetch(root + path + "manifest.json")
            assert status == 200 and json.loads(body)["corpus"]["direction"] == direction, path
            assert headers["Cross-Origin-Embedder-Policy"] == "require-corp", path
        assert fetch(root + "models/fr-en/manifest.json")[0] == 404


def open_page(browser, url, requests):
    page = browser.new_page()
    page.on("request", lambda request: requests.append(request.url))
    page.goto(url)
    return page


# Sentences of everyday life written for this test (not from the default corpus).
EVERYDAY = [
    "請問最近的地鐵站怎麼走？我的手機沒電了。",
    "明天早上八點開會，別忘了帶筆記本電腦。",
    "這家餐廳的湯太鹹了，我們換一家吧。",
    "Dr. Lee said the pharmacy opens at 9 a.m. on Sundays.",
]
OPTIONS = {
    "alpha": 1.5,
    "max_length": 9,
    "no_repeat_ngram": 2,
    "nbest": 3,
}  # each different from the export's
CAMEL = {"max_length": "maxLength", "no_repeat_ngram": "noRepeatNgram"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "runtime, variant",
    [
        ("onnx", "fp32"),
        ("onnx", "int8"),
        ("litert", "fixed"),
        ("litert", "int8-fixed"),
        ("litert", "fixed-text"),
    ],
)
def test_page_translates_as_the_python_runner(browser, artifacts, runtime, variant, tmp_path):
    """50 test-split sentences, five of them as one paragraph, everyday sentences from outside the
    corpus and the odd inputs, greedy and beam, with the export's options and with others: the
    page's translations, scores and alternatives equal `kformer translate --runtime onnx`'s (or
    tflite's, for LiteRT.js; the same runner, in this process); no request leaves 127.0.0.1; once
    loaded the page works offline."""
    lines = [source for source, _ in split_sentences()[:50]]
    lines += [
        "".join(lines[:5]),
        "",
        "   ",
        "😀😀",
        "我" * 40,
        "Tom is here.",
        "我們試試看！\n\n他很高興，因為",
        *EVERYDAY,
    ]
    requests = []
    with serving_page(artifacts, runtime, variant) as url:
        page = open_page(browser, url, requests)
        info = page.evaluate("window.kformer.ready")
        assert (info["variant"], info["beamSize"]) == (variant, BEAM)
        # The page fetches a search's file the first time it runs (ONNX: a file per search, the
        # default's at load); after that, it translates with no network at all.
        fetched = {s: any(r.endswith(f"/{s}.onnx") for r in requests) for s in ("greedy", "beam")}
        assert fetched == {"greedy": False, "beam": runtime == "onnx"}  # the default search's file alone
        page.evaluate("window.kformer.translate(['我'], {beam: 1})")
        assert any(r.endswith("/greedy.onnx") for r in requests) == (runtime == "onnx")
        page.context.set_offline(True)
        assert (
            page.evaluate("fetch('/model/manifest.json').then(() => 'online', () => 'offline')") == "offline"
        )
        for beam, options in [(1, {}), (BEAM, {}), (1, {"max_length": 5}), (BEAM, OPTIONS)]:
            search = SearchOptions(beam_size=beam)
            runner = open_listed(artifacts, web.PAGE_RUNTIMES[runtime][0], variant, options=search)
            expected = [t.to_dict() for t in runner.translations(lines, SearchOptions(**options))]
            page_options = {"beam": beam, **{CAMEL.get(k, k): v for k, v in options.items()}}
            got = page.evaluate(
                "([lines, o]) => window.kformer.translations(lines, o)", [lines, page_options]
            )
            for a, b in zip(got, expected):
                assert a["translation"] == b["translation"], (beam, options, a, b)
                assert [h["translation"] for h in a["alternatives"]] == [
                    h["translation"] for h in b["alternatives"]
                ]
                assert a["score"] == pytest.approx(b["score"], rel=1e-3, abs=1e-3), (beam, options, b)
            assert len(got) == len(expected)
        lone = ["半個\ud800字"]  # no character: "?" in the page as in the Python runners
        assert page.evaluate("(t) => window.kformer.translate(t, {beam: 1})", lone) == runner.translate(
            lone, SearchOptions(beam_size=1)
        )
        paragraph = page.evaluate("(lines) => window.kformer.translate(lines, {beam: 1})", lines[:5])
        assert page.evaluate("(text) => window.kformer.translate([text], {beam: 1})", lines[50]) == [
            " ".join(paragraph)
        ]
        page.click("#translate")
        page.wait_for_function("document.getElementById('output').textContent.length > 0")
        assert page.text_content("#timing").endswith(" s")
        page.screenshot(path=str(tmp_path / "page.png"))
        assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        origin = url.split("?")[0]
    assert requests and all(r.startswith(origin) for r in requests), requests


@pytest.mark.slow
def test_page_offers_each_served_pair_and_runs_the_chosen_one(browser, two_pairs):
    """Under a server of two pairs: the page runs the first pair's export and lists both; once
    en-zh is chosen it runs en-zh's export, as the Python runner of that file translates."""
    english = ["Tom is here.", "Let us try it.", "He was very happy because all his friends came."]
    with serving(create_app(list(two_pairs.values()))) as url:
        page = open_page(browser, url, [])
        assert page.evaluate("window.kformer.ready")["direction"] == "zh-en"
        page.wait_for_selector("#pair", state="visible")
        assert page.eval_on_selector_all("#pair option", "all => all.map((o) => [o.value, o.text])") == [
            ["/models/zh-en/", "Chinese → English"],
            ["/models/en-zh/", "English → Chinese"],
        ]
        assert page.input_value("#pair") == "/models/zh-en/"
        assert page.input_value("#source").startswith("我們試試看")  # the page's example: Chinese
        with page.expect_navigation():
            page.select_option("#pair", "/models/en-zh/")
        assert page.evaluate("window.kformer.ready")["direction"] == "en-zh"
        page.wait_for_selector("#pair", state="visible")
        assert page.input_value("#pair") == "/models/en-zh/"
        assert (
            page.input_value("#source") == ""
            and page.get_attribute("#source", "placeholder") == "Text in English"
        )
        for beam in (1, BEAM):
            got = page.evaluate("([lines, beam]) => window.kformer.translate(lines, {beam})", [english, beam])
            search = SearchOptions(beam_size=beam)
            assert got == two_pairs["en-zh"].translate(english, search), beam
            assert got != two_pairs["zh-en"].translate(english, search), beam


@pytest.mark.slow
def test_page_shows_a_corrupted_artifact(browser, artifacts, tmp_path):
    damaged = tmp_path / "art"
    shutil.copytree(artifacts, damaged)
    with open(damaged / "onnx" / "fp32" / "beam.onnx", "r+b") as f:  # the default search's: loaded first
        f.seek(1000)
        f.write(b"\0" * 16)
    with serving_page(str(damaged)) as url:
        page = open_page(browser, url, [])
        page.wait_for_selector("#status.error")
        assert "onnx/fp32/beam.onnx is corrupted or truncated" in page.text_content("#status")
        assert page.is_disabled("#translate")


@pytest.mark.slow
def test_page_runs_the_litert_file_an_export_has_or_says_how_to_write_it(browser, artifacts, tmp_path):
    """?runtime=litert without a variant: the first of the page's LiteRT files the export has (as
    page.default_variant says); a variant it lacks: one line saying how to write it."""
    only = str(tmp_path / "art")
    shutil.copytree(artifacts, only)
    dropped = ("fixed-text", "fixed", "fp16-fixed")
    manifest_edited(
        only, lambda m: m.update(artifacts=[a for a in m["artifacts"] if a["variant"] not in dropped])
    )
    assert web.default_variant(only, "litert") == "int8-fixed"
    with serving(page_app(os.path.abspath(only))) as url:
        page = open_page(browser, f"{url}?runtime=litert", [])
        assert page.evaluate("window.kformer.ready")["variant"] == "int8-fixed"
        page = open_page(browser, f"{url}?runtime=litert&variant=fp16-fixed", [])
        page.wait_for_selector("#status.error")
        status = page.text_content("#status")
        assert "no tflite fp16-fixed file" in status and "--formats tflite --quantize fp16" in status, status


@pytest.mark.slow
def test_bench_web_measures_page_and_python(browser, artifacts, tmp_path):
    from kformer.bench.web import bench_web, print_web_table

    results = bench_web(
        artifacts,
        sentences=3,
        rounds=1,
        screenshot=str(tmp_path / "shot.png"),
        browser=browser,
        progress=lambda *a, **k: None,
    )
    rows = results["rows"]
    assert {(r["runtime"], r["variant"], r["search"]) for r in rows} == {
        (r, v, s)
        for r, v in [("onnx", "fp32"), ("onnx", "int8"), ("litert", "fixed-text")]
        + [("litert", v) for v in tflite.FIXED_IDS]  # every page variant the export has
        for s in ("greedy", f"beam{BEAM}")
    }
    assert all(r["page_ms"] > 0 and r["python_ms"] > 0 and r["page_bytes"] > 1e6 for r in rows)
    assert (tmp_path / "shot.png").stat().st_size > 1000
    print_web_table(results)
