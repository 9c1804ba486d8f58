"""Smoke tests of the benchmarks (tiny model, few tokens): they run and report consistent
numbers. No timing is asserted; the benchmarks themselves print ratios measured in one run."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import BEAM, python_lines, run_kformer

from kformer.bench.decode import bench_decode, print_decode_table
from kformer.bench.runtimes import worker
from kformer.bench.train import print_train_table
from kformer.contracts.export import ExportManifest
from kformer.decode.options import SearchOptions
from kformer.evaluate import score


def test_bench_decode_times_the_same_work_in_every_variant(model_dir, capsys):  # noqa: F811
    results = bench_decode(model_dir, batch_sizes=(1, 2), output_tokens=6, repeats=1)
    rows = results["rows"]
    assert len(rows) == 2 * 2 * 4  # batch sizes x searches x (cached, cached_xla, naive, naive_eager)
    assert {r["variant"] for r in rows} == {"cached", "cached_xla", "naive", "naive_eager"}
    for r in rows:
        assert r["same_tokens_as_naive"], r  # cache, XLA and eager decode what the prefix re-run decodes
        assert r["generated_tokens"] == r["batch"] * 6, r  # EOS barred: every row does all 6 steps
    print_decode_table(results)
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 + len(rows) and table[-1].split()[:3] == ["2", "beam4", "naive_eager"]


def test_runtime_worker_measures_the_runtime_it_names(artifacts, tmp_path):  # noqa: F811
    from kformer.export.onnx import OnnxRunner

    sources = ["我們試試看！", "他很高興。", "好", "我們走吧。他很高興。"]
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"sources": sources, "batch1_sentences": 3, "batch_size": 2 * BEAM}))
    row = worker(artifacts, "tflite", "fp32", BEAM, str(job))
    assert row["search"] == f"beam{BEAM}" and row["batch1_ms"] > 0 and row["file_s"] > 0
    assert row["batch_size"] == 2 * BEAM  # the runner's --batch-size, as the job asks
    assert row["file_sentences_per_s"] == pytest.approx(len(sources) / row["file_s"])
    assert 0 < row["imported_mb"] < row["loaded_mb"] <= row["peak_rss_mb"]
    onnx = OnnxRunner(artifacts)  # another runtime (the export's beam), which must give the same translations
    assert row["hypotheses"] == onnx.translate(sources)  # the whole file, the two-sentence line included
    singles = [onnx.translate([s])[0] for s in sources[:3]]  # the batch-1 sentences: the first three
    assert row["batch1_output_tokens"] == pytest.approx(sum(map(len, onnx.tokenizer.encode(singles))) / 3)
    assert row["file_output_tokens"] == sum(map(len, onnx.tokenizer.encode(row["hypotheses"])))


def test_reference_model_trains_one_step():
    import numpy as np
    from conftest import random_ids

    from kformer.bench.train import reference_model
    from kformer.model.config import preset
    from kformer.train.fit import compile_model
    from kformer.train.recipe import recipe

    config = preset("tiny", vocab_size=50)
    model = compile_model(reference_model(config), config, recipe("tiny"), xla=False)
    before = [np.array(w) for w in model.trainable_weights]
    rng = np.random.default_rng(0)
    x = {
        "source_ids": random_ids(rng, 4, 6, 50, pad_tail=2),
        "target_ids": random_ids(rng, 4, 5, 50, pad_tail=1),
    }
    loss, _ = model.train_on_batch(x, np.roll(x["target_ids"], -1, axis=1))  # loss, token accuracy
    assert np.isfinite(loss) and loss > 0
    assert all(np.abs(np.array(w) - b).max() > 0 for w, b in zip(model.trainable_weights, before))


@pytest.mark.slow
def test_bench_train_compares_same_size_models_on_the_same_pairs(capsys):
    from kformer.bench.train import bench_train
    from kformer.model import flops

    results = bench_train(
        "tiny", steps=3, rounds=1, precision="bfloat16", recipe_changes={"batch_tokens": 128}
    )
    assert results["variants"] == [
        "kformer",
        "kformer_xla",
        "keras_hub",
        "kformer_float32",
        "keras_hub_bfloat16",
    ]
    kformer, xla, hub = results["kformer"], results["kformer_xla"], results["keras_hub"]
    assert len({results[name]["parameters"] for name in results["variants"]}) == 1
    assert hub["padding"] == kformer["padding"] < xla["padding"]  # same batches; buckets pad more
    assert [results[name]["precision"] for name in results["variants"]] == [
        "bfloat16",
        "bfloat16",
        "float32",
        "float32",
        "bfloat16",
    ]
    assert results["vs_keras_hub"] == kformer["target_tokens_per_s"] / hub["target_tokens_per_s"]
    assert results["vs_keras_hub_float32"] == (
        results["kformer_float32"]["target_tokens_per_s"] / hub["target_tokens_per_s"]
    )
    # the same batches, hence the same FLOPs: utilization follows the speed, over each one's peak
    peaks = results["peaks"]
    assert sorted(peaks) == ["bfloat16", "float32"] and peaks["bfloat16"]["datasheet"] is None  # a CPU
    for name in ("kformer", "keras_hub", "kformer_float32", "kformer_xla"):
        r = results[name]
        peak = peaks[r["precision"]]
        assert r["mfu_squares"] == pytest.approx(r["tflops"] * 1e12 / peak["squares"])
        assert r["mfu_own_shapes"] == pytest.approx(r["tflops"] * 1e12 / peak["own_shapes"])
        assert 0.1 < r["cores_busy"] <= results["cores"] + 0.2  # the process's CPU time over wall time
        if name != "kformer_xla":  # whose bucketed batches hold other pairs
            assert r["tflops"] / r["target_tokens_per_s"] == pytest.approx(
                kformer["tflops"] / kformer["target_tokens_per_s"]
            )
    print_train_table(results)
    table = capsys.readouterr().out
    low, high = results["vs_keras_hub_rounds"]  # one round: its ratio is the medians'
    assert low == high == pytest.approx(results["vs_keras_hub"])
    assert (
        f"kformer (bfloat16) vs keras-hub (float32), target tokens/s: {results['vs_keras_hub']:.2f}x "
        f"(rounds {low:.2f}-{high:.2f})" in table
    )
    assert (
        "keras_hub_bfloat16  bfloat16" in table and "peak TFLOP/s on CPU, bfloat16: matmul squares" in table
    )
    assert flops.TRAINING_FACTOR == 3


def _tiny_bench_train(**changes):
    """bench_train on the tiny model: 2 float32 steps, one round, no keras-hub reference."""
    from kformer.bench import train as bench

    settings = dict(
        steps=2, rounds=1, precision="float32", reference=False, recipe_changes={"batch_tokens": 128}
    )
    return bench.bench_train("tiny", **{**settings, **changes})


def test_bench_train_without_the_reference_needs_no_keras_hub(monkeypatch):

    monkeypatch.setitem(sys.modules, "keras_hub", None)  # as if installed without [bench]
    results = _tiny_bench_train()
    assert results["variants"] == ["kformer", "kformer_xla"] and "vs_keras_hub" not in results


def test_bench_train_times_xla_at_several_steps_a_call(capsys, monkeypatch):
    """--steps-per-call N adds XLA at N steps a call of Keras' train function (steps_per_execution),
    timed beside XLA at one, the variants taking turns in whole calls; --variants keeps only those
    named, and a name not among them is refused before any batch is made."""
    from kformer.bench import train as bench

    results = _tiny_bench_train(steps=4, steps_per_call=3, variants=["kformer_xla", "kformer_xla_3"])
    assert results["variants"] == ["kformer_xla", "kformer_xla_3"] and results["chunk"] == 6
    xla, calls = results["kformer_xla"], results["kformer_xla_3"]
    assert (xla["steps_per_call"], calls["steps_per_call"]) == (1, 3)
    assert results["steps_per_call_speedup"] == calls["target_tokens_per_s"] / xla["target_tokens_per_s"]
    assert "xla_speedup" not in results  # the variant without XLA did not run
    print_train_table(results)
    assert f"XLA, 3 steps a call vs one: {results['steps_per_call_speedup']:.2f}x" in capsys.readouterr().out
    monkeypatch.setattr(bench, "_fixed_batches", None)  # refused before the corpus is read
    with pytest.raises(ValueError, match="--variants kformer_xla_4: choose from kformer, kformer_xla"):
        _tiny_bench_train(variants=["kformer_xla_4"])


def test_bench_train_profile_says_which_op_types_took_the_step(tmp_path, capsys):
    """With a profile folder, the variant without XLA runs once more under TensorFlow's profiler:
    its trace is written there, the op types it reports are those of the model's step (the
    loss's softmax and matrix products among them), ranked, with shares of the busy time that add up
    to at most 1. On a CPU the XLA variant, one op to the profiler, is left out."""

    results = _tiny_bench_train(profile=str(tmp_path))
    assert list(results["profile"]) == ["kformer"]  # no GPU here: no kformer_xla
    found = results["profile"]["kformer"]
    assert found["trace"] == str(tmp_path / "kformer") and list((tmp_path / "kformer").rglob("*.xplane.pb"))
    busy = [op for op in found["ops"] if op["type"] != "IDLE"]
    types = [op["type"] for op in busy]
    # the loss's softmax (oneDNN's _MklSoftmax, or Softmax without oneDNN) and the products
    assert any("Softmax" in t for t in types) and any("MatMul" in t for t in types), types
    times = [op["ms_per_step"] for op in busy]
    assert times == sorted(times, reverse=True) and all(t > 0 for t in times)
    assert 0 < sum(op["share"] for op in busy) <= 1 + 1e-9
    print_train_table(results)
    assert "where kformer's step goes" in capsys.readouterr().out


def test_bench_train_divides_by_the_faster_of_two_peak_measurements(monkeypatch):
    """The matrix-product peaks are measured before and after the timing and the faster kept (a
    slow phase of the machine during one of them would otherwise inflate the utilization)."""
    from kformer.bench import train as bench

    measured = iter([(3e9, 1e9), (2e9, 4e9)])  # (squares, own shapes): before, then after

    def peaks(config, precision, batches):
        squares, own = next(measured)
        return {"device": "CPU", "datasheet": None, "squares": squares, "own_shapes": own}

    monkeypatch.setattr(bench, "_peaks", peaks)
    results = _tiny_bench_train()
    assert results["peaks"]["float32"] == {
        "device": "CPU",
        "datasheet": None,
        "squares": 3e9,
        "own_shapes": 4e9,
    }
    row = results["kformer"]
    assert row["mfu_squares"] == pytest.approx(row["tflops"] * 1e12 / 3e9)


def test_bench_train_on_one_shape_compiles_once_and_pads_nothing():
    from kformer.bench import train as bench

    results = _tiny_bench_train(length=10, recipe_changes={"batch_tokens": 120})
    assert results["distinct_bucket_shapes"] == 1 and results["pairs_per_step"] == 12, results
    assert results["batches"] == "one shape, 10 tokens a side"
    plain, xla = results["kformer"], results["kformer_xla"]
    assert plain["padding"] == xla["padding"] == 0 and results["target_tokens"] == 2 * 12 * 10
    assert plain["tflops"] / plain["target_tokens_per_s"] == pytest.approx(
        xla["tflops"] / xla["target_tokens_per_s"]
    )
    with pytest.raises(ValueError, match=r"--length 33: choose 1\.\.32"):
        bench.bench_train("tiny", reference=False, length=33)


def test_bench_train_without_its_extra_stops_before_any_work(monkeypatch):
    from kformer.bench import train as bench

    monkeypatch.setitem(sys.modules, "keras_hub", None)  # as if installed without [bench]
    monkeypatch.setattr(bench, "_fixed_batches", lambda *a, **k: pytest.fail("read the corpus first"))
    with pytest.raises(
        ValueError, match=r"kformer bench train needs keras_hub.*pip install 'kformer\[bench\]'"
    ):
        bench.bench_train("tiny")


def test_bench_runtimes_takes_a_folder_relative_to_where_it_is_run(
    artifacts, trained_dir, tmp_path, monkeypatch
):
    """Each measurement runs in a process of its own, started in another folder: a relative export
    folder (`kformer bench runtimes --model ART`) must reach it as a path that still works there."""
    from kformer.bench import runtimes

    shutil.copytree(artifacts, tmp_path / "ART")
    manifest = ExportManifest.load(tmp_path / "ART").replace(trained_in=trained_dir)
    manifest.save(tmp_path / "ART")  # the model's test split is read for BLEU
    started = []

    def start(argv, cwd, **kwargs):  # records the measurement's process instead of starting it
        started.append(os.path.join(cwd, argv[3]))
        raise InterruptedError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "run", start)
    with pytest.raises(InterruptedError):
        runtimes.bench_runtimes("ART", sentences=2, rounds=1, progress=lambda *a, **k: None)
    assert os.path.isfile(os.path.join(started[0], "manifest.json"))


def _timed(runtime, variant, search, file_s, batch1_ms):
    return {
        "runtime": runtime,
        "variant": variant,
        "search": search,
        "file_s": file_s,
        "batch1_ms": batch1_ms,
    }


def test_runtimes_are_set_against_ctranslate2_of_the_same_search_and_precision_and_its_fastest():
    from kformer.bench.runtimes import _against_ctranslate2

    rows = [
        _timed("ctranslate2", "fp32", "greedy", 10, 10),
        _timed("ctranslate2", "int8", "greedy", 5, 20),  # int8 faster on the file, slower at batch 1
        _timed("onnx", "fp32", "greedy", 15, 15),
        _timed("onnx", "int8", "greedy", 10, 10),
        _timed("onnx", "int8-ort", "greedy", 5, 5),  # onnxruntime's own int8: also set against int8
        _timed("tflite", "fp16", "greedy", 20, 40),
        _timed("onnx", "fp32", "beam4", 30, 10),  # no CTranslate2 beam row
    ]
    _against_ctranslate2(rows)

    def medians(ratios):
        return ratios and (ratios["file_s"][0], ratios["batch1_ms"][0])

    same = [(1, 1), (1, 1), (1.5, 1.5), (2, 0.5), (1, 0.25), (2, 4), None]
    assert [medians(r["vs_ct2"]) for r in rows] == same
    # The fastest: int8's 5 on the file, fp32's 10 at batch 1.
    fastest = [(2, 1), (1, 2), (3, 1.5), (2, 1), (1, 0.5), (4, 4), None]
    assert [medians(r["vs_ct2_fastest"]) for r in rows] == fastest


def _rounds(runtime, variant, times, backend=None):
    """A row reduced from rounds of file times `times` (batch 1: 1000x each)."""
    from kformer.bench.runtimes import _median_row

    return _median_row(
        [
            {
                **_timed(runtime, variant, "greedy", s, 1000 * s),
                "backend": backend,
                "load_s": 1,
                "file_sentences_per_s": 500 / s,
                "imported_mb": 1,
                "loaded_mb": 2,
                "peak_rss_mb": 3,
            }
            for s in times
        ]
    )


def test_ratios_to_ctranslate2_are_taken_round_by_round():
    from kformer.bench.runtimes import _against_ctranslate2

    # CTranslate2 slow in round 2 only: the medians alone (15 / 5) would say 3x; round by round it is 2, 2, 4.
    rows = [
        _rounds("ctranslate2", "fp32", [5, 15, 5]),
        _rounds("ctranslate2", "int8", [8, 12, 8]),
        _rounds("onnx", "fp32", [10, 30, 20]),
    ]
    _against_ctranslate2(rows)
    assert rows[2]["vs_ct2"]["file_s"] == rows[2]["vs_ct2"]["batch1_ms"] == (2, 2, 4)
    assert rows[0]["vs_ct2"]["file_s"] == (1, 1, 1)
    # The fastest in each round: 5, 12, 5 -> 2, 2.5, 4.
    assert rows[2]["vs_ct2_fastest"]["file_s"] == (2.5, 2, 4)


def test_ctranslate2_on_two_backends_is_timed_on_the_faster_in_each_round():
    from kformer.bench.runtimes import _against_ctranslate2

    rows = [
        _rounds("ctranslate2", "fp32", [20, 2, 20], "mkl"),
        _rounds("ctranslate2", "fp32", [5, 5, 5], "dnnl"),
        _rounds("onnx", "fp32", [5, 5, 10]),
    ]
    _against_ctranslate2(rows)
    # CTranslate2 fp32 took 5, 2, 5: onnxruntime 1, 2.5, 2 of it.
    assert rows[2]["vs_ct2"]["file_s"] == rows[2]["vs_ct2_fastest"]["file_s"] == (2, 1, 2.5)
    assert rows[0]["vs_ct2"]["file_s"] == (4, 1, 4)  # MKL against the faster of the two


@pytest.mark.parametrize("parallel", [1, 2])
def test_bench_runtimes_measures_ctranslate2_in_each_setting(
    artifacts, trained_dir, tmp_path, monkeypatch, parallel
):
    """Every CTranslate2 file is measured with CT2_USE_MKL on and off (x86-64), on the bench's
    threads and (one batch at a time) on one, each its own row; the other runtimes once, in their own
    environment."""
    from kformer.bench import runtimes

    shutil.copytree(artifacts, tmp_path / "ART")
    manifest = ExportManifest.load(tmp_path / "ART").replace(trained_in=trained_dir)
    manifest.save(tmp_path / "ART")
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    monkeypatch.delenv("CT2_USE_MKL", raising=False)
    started = []

    def measure(code, artifact_dir, runtime, variant, beam, job_file, threads, cwd, env):
        """A worker's result without running it: 1 s on the file, CT2_USE_MKL and threads recorded."""
        started.append((runtime, variant, beam, (env.get("CT2_USE_MKL"), threads)))
        with open(job_file, encoding="utf-8") as f:
            sentences = len(json.load(f)["sources"])
        row = {"runtime": runtime, "variant": variant, "search": "greedy" if beam == "1" else "beam"}
        row.update(file_s=1, batch1_ms=1, load_s=1, file_sentences_per_s=sentences)
        row.update(imported_mb=1, loaded_mb=1, peak_rss_mb=1, hypotheses=["x"] * sentences)
        with open(os.path.join(cwd, "out.json"), "w", encoding="utf-8") as f:
            json.dump(row, f)

    monkeypatch.setattr(runtimes.subprocesses, "run_python", measure)
    results = runtimes.bench_runtimes(
        str(tmp_path / "ART"),
        sentences=2,
        rounds=1,
        runtimes=["ctranslate2", "onnx"],
        parallel=parallel,
        progress=print,
    )
    variants = sorted({a.variant for a in manifest.artifacts if a.format == "ctranslate2"})
    threads = ["", "1"] if parallel == 1 else [""]  # "": the bench's
    assert sorted({(v, setting) for r, v, _, setting in started if r == "ctranslate2"}) == [
        (v, (mkl, t)) for v in variants for mkl in ("0", "1") for t in threads
    ]
    assert {(r, setting) for r, _, _, setting in started if r != "ctranslate2"} == {("onnx", (None, ""))}
    names = ["mkl", "dnnl"] + (["mkl, 1 thread", "dnnl, 1 thread"] if parallel == 1 else [])
    backends = {(r["variant"], r["backend"]) for r in results["rows"] if r["runtime"] == "ctranslate2"}
    assert backends == {(v, b) for v in variants for b in names}
    assert len(started) == len(results["rows"])  # a process per row (search, setting) in one round


def test_bench_runtimes_translates_a_source_file_and_scores_it_with_references(
    artifacts, tmp_path, monkeypatch, capsys
):
    """--source: the file's first --sentences lines go to the workers (an import has no test
    split); BLEU against --reference where given, none ("-" in the table) without; --reference
    alone is refused."""
    from kformer.bench import runtimes

    lines = ["我們試試看！", "他很高興。", "湯太鹹了。"]
    (tmp_path / "src.txt").write_text("".join(f"{s}\n" for s in lines), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("Let's try!\nHe is happy.\nThe soup is too salty.\n", encoding="utf-8")
    given = []

    def measure(code, artifact_dir, runtime, variant, beam, job_file, threads, cwd, env):
        with open(job_file, encoding="utf-8") as f:
            given.append(json.load(f)["sources"])
        row = {"runtime": runtime, "variant": variant, "search": "greedy" if beam == "1" else "beam"}
        row.update(file_s=1, batch1_ms=1, load_s=1, file_sentences_per_s=1, batch1_output_tokens=1)
        row.update(imported_mb=1, loaded_mb=1, peak_rss_mb=1, hypotheses=["He is happy."] * len(given[-1]))
        with open(os.path.join(cwd, "out.json"), "w", encoding="utf-8") as f:
            json.dump(row, f)

    monkeypatch.setattr(runtimes.subprocesses, "run_python", measure)
    options = {"sentences": 2, "rounds": 1, "runtimes": ["onnx"], "progress": lambda *a, **k: None}
    scored = runtimes.bench_runtimes(
        artifacts, source=str(tmp_path / "src.txt"), reference=str(tmp_path / "ref.txt"), **options
    )
    assert given and all(sources == lines[:2] for sources in given)
    assert {r["bleu"] for r in scored["rows"]} == {
        score(["He is happy."] * 2, [["Let's try!"], ["He is happy."]], "en")["bleu"]
    }
    unscored = runtimes.bench_runtimes(artifacts, source=str(tmp_path / "src.txt"), **options)
    assert {r["bleu"] for r in unscored["rows"]} == {None}
    runtimes.print_runtimes_table(unscored)
    assert "file: 2 src.txt sentences" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--reference needs --source"):
        runtimes.bench_runtimes(artifacts, reference=str(tmp_path / "ref.txt"), **options)


def test_a_vmap_counted_from_pairs_allows_each_source_pieces_partners(tokenizer):
    """count_vmap: a source piece allows the target pieces of highest Dice with it, at most
    `per_source`; "" allows the `frequent` commonest; pieces outside the vocabulary are left out."""
    from kformer.bench.vmap import count_vmap

    pieces = lambda text: tokenizer.encode(text, out_type=str)  # noqa: E731
    pairs = [("貓", "cat"), ("貓", "the cat"), ("狗", "the dog"), ("狗", "dog"), ("貓 狗", "cat dog")] * 3
    vmap = count_vmap(tokenizer, pairs, per_source=2, frequent=3)
    cat, dog = pieces("cat"), pieces("dog")
    assert len(cat) <= 2 and len(dog) <= 2 and not set(cat) & set(dog) & set(pieces("the"))
    # 貓 and cat's pieces share all 9 of their pairs (Dice 1); the, 3 of its 6 (0.4); dog, 3 of its 9
    assert set(cat) <= set(vmap[pieces("貓")[-1]]) and set(dog) <= set(vmap[pieces("狗")[-1]])
    assert max(map(len, vmap.values())) == 3 and all(len(v) <= 2 for k, v in vmap.items() if k)
    assert set(vmap[""]) <= {p for text in ("cat", "dog", "the") for p in pieces(text)}
    assert all(tokenizer.piece_to_id(p) != tokenizer.unk_id() for ps in vmap.values() for p in ps)


def test_bench_vmap_translates_through_the_map_and_without_it(artifacts, tmp_path, capsys):
    """The linked folder with vmap.txt: CTranslate2's outputs hold only the pieces the map allows
    where use_vmap is on, others where it is off (the map is in force); the bench gives a row per
    search and setting, and the ratio of time with the map to without."""
    import ctranslate2

    from kformer.bench import vmap as vmap_lib
    from kformer.data.vocabulary import open_tokenizer

    manifest = ExportManifest.load(artifacts)
    folder = os.path.join(artifacts, manifest.artifact("ctranslate2").file)
    tokenizer = open_tokenizer(artifacts, manifest.tokenizer.file)
    allowed = [tokenizer.id_to_piece(i) for i in range(10, 14)]
    vmap_file = str(tmp_path / "vmap.txt")
    vmap_lib.write_vmap({"": allowed}, vmap_file)
    linked = vmap_lib._with_vmap(folder, vmap_file, str(tmp_path))
    translator = ctranslate2.Translator(linked)
    sources = [
        [tokenizer.id_to_piece(i) for i in tokenizer.encode(s)] for s in ["我們試試看！", "他很高興。"]
    ]
    on, off = (translator.translate_batch(sources, use_vmap=v, max_decoding_length=8) for v in (True, False))
    special = {tokenizer.id_to_piece(i) for i in (tokenizer.pad_id(), tokenizer.unk_id(), tokenizer.bos_id())}
    assert all(set(r.hypotheses[0]) <= set(allowed) | special for r in on)  # CTranslate2 adds its specials
    assert any(set(r.hypotheses[0]) & set(allowed) for r in on)
    assert any(set(r.hypotheses[0]) - set(allowed) - special for r in off)
    results = vmap_lib.bench_vmap(
        artifacts, ["我們試試看！", "他很高興。"], vmap_file, rounds=1, progress=lambda *a, **k: None
    )
    assert [(r["search"], r["vmap"]) for r in results["rows"]] == [
        ("greedy", False), ("greedy", True), (f"beam{BEAM}", False), (f"beam{BEAM}", True)
    ]  # fmt: skip
    assert all(r["vs_off"]["file_s"] > 0 for r in results["rows"] if r["vmap"])
    assert vmap_lib.read_vmap(vmap_file) == {"": allowed}
    own = tmp_path / "own"  # a CTranslate2 folder with a map of its own keeps it
    shutil.copytree(folder, own)
    (own / "vmap.txt").write_text("x\ty\n", encoding="utf-8")
    (tmp_path / "work").mkdir()
    vmap_lib._with_vmap(str(own), vmap_file, str(tmp_path / "work"))
    assert (own / "vmap.txt").read_text(encoding="utf-8") == "x\ty\n"
    with pytest.raises(ValueError, match="no sentences to translate"):
        vmap_lib.bench_vmap(artifacts, [], vmap_file, rounds=1)
    assert results["kept"] == {"vocabulary": tokenizer.get_piece_size(), "file": 4, "single": 4}
    vmap_lib.print_vmap_table(results)
    assert "use_vmap off and on" in capsys.readouterr().out


def test_bench_vmap_counts_its_map_from_pairs_and_says_what_is_wrong(artifacts, tmp_path):
    """`kformer bench vmap --pairs TSV`: pairs copied across (names, numbers) count too, and the
    table comes out; a malformed line, or both --vmap and --pairs, is one line naming it."""
    source, pairs, bad = tmp_path / "src.txt", tmp_path / "pairs.tsv", tmp_path / "bad.tsv"
    source.write_text("我們試試看！\n", encoding="utf-8")
    pairs.write_text("Tom\tTom\n我們試試看！\tLet's try!\n", encoding="utf-8")
    bad.write_text("我們\tWe\nno tab here\n", encoding="utf-8")
    common = ["bench", "vmap", "--model", artifacts, "--source", str(source), "--rounds", "1"]
    ran = run_kformer(*common, "--pairs", str(pairs))
    assert ran.status == 0, ran.stderr[-2000:]
    assert "use_vmap off and on" in ran.stdout
    ran = run_kformer(*common, "--pairs", str(bad))
    assert ran.status != 0 and f"{bad}:2: expected source<TAB>target, found 1 fields" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1
    ran = run_kformer(*common, "--pairs", str(pairs), "--vmap", str(pairs))
    assert ran.status != 0 and "give --vmap FILE or --pairs TSV" in ran.stderr


def test_runtime_rounds_are_reduced_to_medians_and_the_highest_memory():
    from kformer.bench.runtimes import _median_row

    rounds = [
        {
            "load_s": s,
            "file_s": 10 * s,
            "file_sentences_per_s": 50 / s,
            "batch1_ms": 100 / s,
            "imported_mb": 40 - s,
            "loaded_mb": 45 + s,
            "peak_rss_mb": 50 + s,
            "bleu": 17.0,
            "runtime": "onnx",
        }
        for s in (1, 4, 2)
    ]
    row = _median_row(rounds)
    assert (row["load_s"], row["file_s"], row["file_sentences_per_s"], row["batch1_ms"]) == (2, 20, 25, 50)
    assert (row["imported_mb"], row["loaded_mb"], row["peak_rss_mb"]) == (39, 49, 54)
    assert row["per_round"] == {"file_s": [10, 40, 20], "batch1_ms": [100, 25, 50]}
    assert row["rounds"] == 3 and row["bleu"] == 17.0


def test_bench_runtimes_measures_the_runtimes_asked_for():
    from kformer.bench.runtimes import _jobs
    from kformer.contracts.export import Artifact, TokenizerEntry

    listed = [
        ("onnx", "fp32"),
        ("onnx", "text"),
        ("onnx", "int8"),
        ("ctranslate2", "fp32"),
        ("savedmodel", "fp32"),
    ]
    artifacts = tuple(Artifact(f"{f}/{v}", format=f, variant=v) for f, v in listed)
    manifest = ExportManifest({}, 4, 0.6, 32, 4, TokenizerEntry(), artifacts)
    assert _jobs(manifest, None) == [
        ("keras", "fp32"),
        ("ctranslate2", "fp32"),
        ("onnx", "fp32"),
        ("onnx", "int8"),
        ("onnx", "text"),
        ("savedmodel", "fp32"),
    ]
    assert _jobs(manifest, ["onnx", "ctranslate2"]) == [
        ("ctranslate2", "fp32"),
        ("onnx", "fp32"),
        ("onnx", "int8"),
        ("onnx", "text"),
    ]
    with pytest.raises(
        ValueError,
        match=r"--runtimes tflite: not in this export \(it has ctranslate2,keras,onnx,savedmodel\)",
    ):
        _jobs(manifest, ["tflite", "onnx"])
    # Batches at once: the runtimes whose runners take it (kformer.decode.runner's parallel)
    assert _jobs(manifest, None, parallel=2) == [("ctranslate2", "fp32"), ("onnx", "fp32"), ("onnx", "int8")]
    with pytest.raises(ValueError, match="--parallel 2: none of these runtimes"):
        _jobs(manifest, ["savedmodel"], parallel=2)


def test_runtime_worker_runs_the_jobs_batches_at_once(artifacts, tmp_path, monkeypatch):  # noqa: F811
    from kformer.export import onnx

    real, opened = onnx._session, []

    def session(path, threads, **kwargs):  # the threads of each session the runner opens
        opened.append(threads)
        return real(path, threads, **kwargs)

    monkeypatch.setattr(onnx, "_session", session)
    job = tmp_path / "job.json"
    sources = ["我們試試看！", "他很高興。", "好"]
    job.write_text(json.dumps({"sources": sources, "batch1_sentences": 1, "batch_size": 1, "parallel": 2}))
    row = worker(artifacts, "onnx", "fp32", 1, str(job), threads=2)
    assert opened == [1]  # before the runner below opens its own session
    greedy = onnx.OnnxRunner(artifacts, options=SearchOptions(beam_size=1))
    assert row["hypotheses"] == greedy.translate(sources)


def test_xla_dump_folder_is_removed_at_exit():
    script = (
        "import os; from kformer.bench import train; train.count_xla_compilations_from_here(); "
        "dump = os.environ[train.XLA_DUMP_ENV]; open(os.path.join(dump, 'x.txt'), 'w').write('hlo'); print(dump)"
    )
    dump = python_lines(script)[-1]
    assert dump and not os.path.exists(dump), dump  # `bench train` leaked ~100 MB a run before


def test_synthetic_corpus_joins_two_or_three_pairs_on_both_sides(tmp_path, corpus_pairs):
    import gzip

    from kformer.bench.data import synthetic_corpus

    path = str(tmp_path / "pairs.tsv.gz")
    assert synthetic_corpus(path, 1000, base=corpus_pairs) == 1000
    with gzip.open(path, "rt", encoding="utf-8") as f:
        written = [tuple(line.rstrip("\n").split("\t")) for line in f]
    assert len(written) == 1000 and written[: len(corpus_pairs)] == corpus_pairs
    english = {t: s for s, t in corpus_pairs}
    for source, target in written[len(corpus_pairs) :]:
        # The English side is whole base sentences joined by spaces; the Chinese side is theirs, in order.
        parts, words = [], target.split(" ")
        while words:
            cut = next(k for k in range(1, len(words) + 1) if " ".join(words[:k]) in english)
            parts.append(" ".join(words[:cut]))
            words = words[cut:]
        assert len(parts) in (2, 3) and source == "".join(english[p] for p in parts), (source, target)
    assert len(set(written)) > 990  # joins seldom repeat


def test_bench_data_measures_every_step_in_its_own_process_and_deletes_its_files(
    tmp_path, corpus_pairs, capsys
):
    from kformer.bench.data import bench_size, print_data_table

    work = tmp_path / "work"
    work.mkdir()
    row = bench_size(2000, str(work), config="tiny", many_steps=30, pipeline_batches=20, base=corpus_pairs)
    assert os.listdir(work) == []  # the corpus, the prepared folder and the runs are gone
    assert 1900 < row["distinct"] <= 2000 and row["prepare_peak_mb"] > 50 and row["bytes_per_pair"] > 10
    train = row["train"]
    assert 0 < train["to_fit"] < train["to_first_step"] < train["seconds"] and train["peak_mb"] > 100
    assert train["steps_per_s"] > 0 and train["pipeline_batches_per_s"] > 0
    for name, steps in (("few", 20), ("many", 30)):
        assert row[f"trained_{name}"]["resumed_from"] == 0 and row[f"resume_{name}"]["resumed_from"] == steps
    assert len(row["worker_peak_mb"]) == 2 and min(row["worker_peak_mb"]) > 100
    print_data_table({"config": "tiny", "sizes": [row]})
    assert capsys.readouterr().out.splitlines()[-1].split()[:2] == ["2,000", f"{row['distinct']:,}"]


def test_train_table_shows_the_datasheet_utilization_on_a_listed_gpu(capsys):
    peak = {"device": "NVIDIA H200", "datasheet": 989.4e12, "squares": 700e12, "own_shapes": 500e12}
    row = dict(precision="bfloat16", steps_per_s=4.0, target_tokens_per_s=95_000, tflops=24.0, padding=0.1)
    row.update(cores_busy=1.25)
    row.update(mfu_datasheet=24e12 / 989.4e12, mfu_squares=24 / 700, mfu_own_shapes=24 / 500)
    results = dict(config="base", steps=12, chunk=5, rounds=2, pairs_per_step=2000, target_tokens=250_000)
    results["batches"] = "the default corpus"
    results.update(
        onednn="on", precision="bfloat16", precision_why="auto", peaks={"bfloat16": peak}, cores=16
    )
    results.update(variants=["kformer"], kformer={**row, "warmup_s": 83.0, "parameters": 60_000_000})
    results.update(xla_speedup=1.5, distinct_bucket_shapes=9, peak_memory_mb=30_000, precision_speedup=2.0)
    results.update(xla_speedup_rounds=(1.25, 1.5), precision_speedup_rounds=(1.9, 2.25))
    print_train_table(results)
    lines = capsys.readouterr().out.splitlines()
    assert "kformer bfloat16 vs float32: 2.00x (rounds 1.90-2.25)" in lines
    assert lines[-1].startswith("XLA vs no XLA: 1.50x (rounds 1.25-1.50); ")
    assert "peak TFLOP/s on NVIDIA H200, bfloat16: datasheet 989.4, matmul squares 700.000" in lines[1]
    header, kformer = lines[2].split(), lines[3].split()
    assert header[5:7] == ["MFU", "datasheet"] and kformer[5:8] == ["2.4%", "3.4%", "4.8%"]
    assert header[-4:] == ["cores", "busy", "of", "16"] and kformer[-1] == "1.25"


def test_bench_train_ratios_carry_the_range_of_the_rounds_ratios():
    from kformer.bench.train import _add_speeds

    peak = {"datasheet": None, "squares": 1e12, "own_shapes": 1e12}
    common = dict(target=600, real=500, flops=1e9, padding=0.1, warmup_s=1.0, parameters=10, steps_per_call=1)
    variants = {
        "kformer": {**common, "precision": "float32", "seconds": [1.0, 2.0, 4.0], "cpu_seconds": 10.5},
        "kformer_xla": {**common, "precision": "float32", "seconds": [2.0, 2.0, 2.0], "cpu_seconds": 6.0},
    }
    results = {"peaks": {"float32": peak}, "steps_per_call": 1}
    _add_speeds(results, variants, steps=6, precision="float32")
    assert results["xla_speedup"] == pytest.approx(1.0)  # medians 2 s and 2 s
    assert results["xla_speedup_rounds"] == pytest.approx((0.5, 2.0))  # rounds: 1/2, 2/2, 4/2
    assert results["kformer"]["cores_busy"] == pytest.approx(1.5)  # 10.5 CPU s in 7 s of all rounds
    assert results["kformer_xla"]["cores_busy"] == pytest.approx(1.0)


def test_bench_alternatives_runs_every_file_and_compares_it_with_keras(artifacts, capsys):
    from kformer.bench.alternatives import EVERYDAY, bench_alternatives, print_alternatives_table

    results = bench_alternatives(artifacts, alternatives=BEAM - 1)
    listed = [(e.format, e.variant) for e in ExportManifest.load(artifacts).artifacts]
    expected = [("keras", "fp32"), *(f for f in listed if f != ("onnx", "text"))]  # text: one translation
    assert list(results["runtimes"]) == [f"{runtime} {variant}" for runtime, variant in expected]
    assert results["sentences"] == len(EVERYDAY["zh"])
    for name, found in results["runtimes"].items():
        assert all(0 <= n <= BEAM - 1 for n in found["counts"]), name
        assert found["full"] == found["counts"].count(BEAM - 1), name
        if name.endswith("fp32") and not name.startswith("ctranslate2"):  # the graphs, exact
            assert found["as_reference"] == results["sentences"], name
    assert results["runtimes"]["keras fp32"]["full"] > 0  # the random model's EOS ends hypotheses early
    print_alternatives_table(results)
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 + len(expected) + 1 and table[2].split()[:2] == ["keras", "fp32"]
    with pytest.raises(ValueError, match="needs a beam of"):
        bench_alternatives(artifacts, alternatives=BEAM)


def test_the_everyday_sentences_are_not_in_the_default_corpus():
    from kformer.bench.alternatives import EVERYDAY
    from kformer.data import corpus as corpus_lib

    pairs, _ = corpus_lib.read_corpus()
    for side, language in enumerate(("zh", "en")):
        known = {pair[side].strip() for pair in pairs}
        assert len(set(EVERYDAY[language])) == 30 and not known & set(EVERYDAY[language]), language


def test_interleave_takes_turns_in_an_order_that_rotates_every_round():
    """Every variant once a round, each round starting one further along, so none always runs right
    after the same other; each round's result kept in order, and each turn said before and after."""
    from kformer.bench.harness import interleave

    order, said = [], []
    found = interleave(
        {"a": 1, "b": 2, "c": 3},
        3,
        lambda variant, number: order.append(variant) or 10 * number + variant,
        lambda text, **kwargs: said.append(text),
        lambda result: f"got {result}",
    )
    assert order == [1, 2, 3, 2, 3, 1, 3, 1, 2]
    assert found == {"a": [1, 11, 21], "b": [2, 12, 22], "c": [3, 13, 23]}
    assert said[:4] == ["round 1/3: a ...", "got 1", "round 1/3: b ...", "got 2"]


def test_round_ratios_give_their_median_and_range_and_rounds_their_medians_and_peaks():
    from kformer.bench.harness import reduced, spread

    assert spread([2, 8, 9], [1, 4, 3]) == (2, 2, 3)  # 2, 2, 3 round by round; the medians' ratio: 2
    rounds = [
        {"s": 3, "mb": 10, "name": "x"},
        {"s": 1, "mb": 30, "name": "y"},
        {"s": 2, "mb": 20, "name": "z"},
    ]
    assert reduced(rounds, medians=["s"], peaks=["mb"]) == {"s": 2, "mb": 30, "name": "x"}


def test_print_table_aligns_each_title_as_its_column(capsys):
    from kformer.bench.harness import print_table

    columns = [
        ("name", "<6", "name"),
        ("speed", "8.2f", "speed"),
        ("x", ">4", lambda r: f"{r['speed']:.0f}x"),
    ]
    print_table(columns, [{"name": "ab", "speed": 3.14159}])
    assert capsys.readouterr().out.splitlines() == ["name      speed    x", "ab         3.14   3x"]


def test_stopwatch_and_a_process_peak_memory():
    """Wall and CPU seconds of a block; a child's exit code and peak resident memory once it has
    ended (the kernel's count, however short it ran), and this process's now and peak. The child
    is started from a small process: Linux carries the starting process's peak over the exec."""
    import time

    from kformer.bench.harness import Stopwatch, memory_mb

    with Stopwatch() as watch:
        time.sleep(0.2)
    assert watch.seconds >= 0.2 and watch.cpu_seconds < 0.1
    allocate = "import sys; b = b'x' * (300 * 2**20); sys.exit(3)"
    script = (
        "import subprocess, sys; from kformer.bench.harness import waited; "
        f"child = subprocess.Popen([sys.executable, '-c', {allocate!r}]); "
        "print(*waited(child), child.returncode)"
    )
    code, peak_mb, returncode = python_lines(script)[-1].split()
    assert code == returncode == "3" and 300 < float(peak_mb) < 1000
    assert 0 < memory_mb("VmRSS") <= memory_mb("VmHWM")


def test_bench_decode_times_the_slow_variants_fewer_times_in_the_same_rounds():
    """The naive re-run is timed half as often as the cached loop, op by op from Python once, all
    in interleaved rounds: the slow ones sit out the later rounds."""
    from kformer.bench.decode import VARIANTS, _timings

    calls = []
    functions = {name: lambda batch, name=name: calls.append(name) for name in VARIANTS}
    seconds = _timings(functions, None, repeats=5)
    assert [calls.count(name) for name in functions] == [5, 5, 2, 1]
    assert calls[:7] == ["cached", "cached_xla", "naive", "naive_eager", "cached_xla", "naive", "cached"]
    assert list(seconds) == list(VARIANTS) and all(s >= 0 for s in seconds.values())


def test_bench_serve_sets_each_level_against_the_runner_round_by_round():
    from kformer.bench.serve import CLIENT_LEVELS, _levels

    found = {
        "runner batch 32": [{"sentences_per_s": 10}, {"sentences_per_s": 20}],
        "runner batch 1": [{"sentences_per_s": 1}, {"sentences_per_s": 3}],
    }
    for n in CLIENT_LEVELS:
        found[f"{n} clients"] = [
            {"sentences_per_s": 10 * n, "p50_ms": 1},
            {"sentences_per_s": 40 * n, "p50_ms": 3},
        ]
    results = _levels(found)
    # 8 clients: 80 and 320 sentences/s, 8 and 16 times the runner's; the medians' ratio would be 200 / 15
    assert results["x_runner"][8] == 12 and results["x_one_client"][8] == 8
    assert results["levels"][8] == {"sentences_per_s": 200, "p50_ms": 2} and results["runner_batch1"] == 2


def test_every_bench_function_reads_at_once():
    """Under 60 own lines (docstring included, nested functions apart) and under 8 parameters (self
    apart) for every function of kformer/bench: past those, split it by what it does, or pass a
    dataclass of settings."""
    import ast
    import pathlib

    from kformer import bench

    too_long = []
    for path in sorted(pathlib.Path(bench.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            inner = [
                n for n in ast.walk(node) if n is not node and isinstance(n, (ast.FunctionDef, ast.ClassDef))
            ]
            lines = set(range(node.lineno, node.end_lineno + 1))
            lines -= {line for n in inner for line in range(n.lineno, n.end_lineno + 1)}
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x]
            parameters = len(names) - (names[:1] == ["self"])
            if len(lines) >= 60 or parameters >= 8:
                too_long.append((path.name, node.name, len(lines), parameters))
    assert too_long == []


def test_bench_judge_counts_the_resamples_each_judge_gets_right():
    """Two fabricated runs: the better has the lower loss on every dev pair and the same
    translations, so the loss prefers it on every resample and BLEU/chrF tie on each (half)."""
    import numpy as np

    from kformer.bench.judge import _shares

    references = ["A cat sat.", "It rains today.", "We eat rice.", "He runs fast.", "Tea is hot."]
    greedy = ["A cat sat.", "It rains.", "We eat.", "He ran fast.", "Tea hot."]
    tokens = np.array([4, 4, 4, 4, 3])

    def run(loss):
        return {"greedy": greedy, "losses": (loss * tokens, tokens), "language": "en"}

    references = [[r] for r in references]
    shares = _shares(run(np.full(5, 1.0)), run(np.array([1.5, 1.1, 1.2, 2.0, 1.3])), references, 50, 0)
    assert shares == {"bleu": 0.5, "chrf": 0.5, "loss": 1.0}
    other = {**run(np.full(5, 2.0)), "greedy": [r for (r,) in references]}  # worse loss, perfect translations
    shares = _shares(run(np.full(5, 1.0)), other, references, 50, 0)
    assert shares == {"bleu": 0.0, "chrf": 0.0, "loss": 1.0}


def test_bench_judge_finds_a_run_and_its_copy_alike(trained_dir, tmp_path, capsys):
    """A run against a copy of itself: the same test BLEU, and every judge ties on every resample."""
    from kformer.bench.judge import bench_judge, print_judge_table
    from kformer.data import prepare

    copy = str(tmp_path / "copy")
    shutil.copytree(trained_dir, copy)
    pairs = prepare.held_out(os.path.join(trained_dir, "data"), "dev")[:12]
    dev, test = tmp_path / "dev.tsv", tmp_path / "test.tsv"
    for path, part in ((dev, pairs[:8]), (test, pairs[8:])):
        path.write_text("".join(f"{s}\t{t}\n" for s, t in part), encoding="utf-8")
    results = bench_judge([trained_dir, copy], str(dev), str(test), resamples=20)
    assert (results["dev_sources"], results["test_sources"]) == tuple(
        len({s for s, _ in p}) for p in (pairs[:8], pairs[8:])
    )
    (row,) = results["pairs"]
    assert row["test_bleu"][0] == row["test_bleu"][1]
    assert (row["bleu"], row["chrf"], row["loss"]) == (0.5, 0.5, 0.5)
    print_judge_table(results)
    assert len(capsys.readouterr().out.splitlines()) == 3
