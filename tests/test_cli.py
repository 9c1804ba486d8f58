import io
import os
import sys

import pytest
from conftest import KFORMER, run_process

from kformer.cli import main
from kformer.train.recipe import TrainingRecipe


def run(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_train_command_writes_a_training_directory(tmp_path, corpus_tsv, capsys):
    out = str(tmp_path / "run")
    code, stdout, _ = run(
        [
            "train",
            "--config",
            "tiny",
            "--data",
            corpus_tsv,
            "--out",
            out,
            "--steps",
            "2",
            "--vocab-size",
            "1200",
            "--accumulate",
            "2",
            "--average",
            "0.5",
            "--eval-steps",
            "1",
        ],
        capsys,
    )
    assert code == 0 and '"steps": 2' in stdout
    written = {"config.json", "recipe.json", "tokenizer.model", "model.keras", "best.weights.h5"}
    assert written <= set(os.listdir(out))
    recipe = TrainingRecipe.of_run(out)
    assert (recipe.accumulate_steps, recipe.ema_momentum) == (2, 0.5)


def test_train_precision_option():
    from kformer.cli import build_parser

    def precision(*argv):
        return build_parser().parse_args(["train", "--out", "X", *argv]).precision

    assert precision() == "auto"
    assert precision("--precision", "bfloat16") == "bfloat16"
    with pytest.raises(SystemExit):
        precision("--precision", "half")


def test_train_saves_every_save_minutes(monkeypatch, capsys):
    import kformer.train.fit

    calls = []
    monkeypatch.setattr(kformer.train.fit, "run", lambda out_dir, options: calls.append(options) or {})
    main(["train", "--out", "X", "--steps", "3"])
    main(["train", "--out", "X", "--steps", "3", "--save-minutes", "0.5"])
    assert [c.checkpoint_seconds for c in calls] == [300, 30]


def test_train_keeps_the_best_by_the_judge_asked_for(monkeypatch, capsys):
    import kformer.train.fit

    calls = []
    monkeypatch.setattr(kformer.train.fit, "run", lambda out_dir, options: calls.append(options) or {})
    for judge in ([], ["--keep-best-by", "loss"], ["--keep-best-by", "bleu"]):
        main(["train", "--out", "X", "--steps", "3", *judge])
    assert [c.evaluation.judge for c in calls] == [None, "loss", "bleu"]  # None: the run's default
    with pytest.raises(SystemExit):
        main(["train", "--out", "X", "--keep-best-by", "chrf"])


def test_train_command_with_aligned_files(tmp_path, corpus_pairs, capsys):
    source, target = tmp_path / "train.zh", tmp_path / "train.en"
    source.write_text("".join(s + "\n" for s, _ in corpus_pairs), encoding="utf-8")
    target.write_text("".join(t + "\n" for _, t in corpus_pairs), encoding="utf-8")
    code, stdout, _ = run(
        [
            "train",
            "--config",
            "tiny",
            "--data",
            str(source),
            str(target),
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "1",
            "--vocab-size",
            "1200",
        ],
        capsys,
    )
    assert code == 0 and '"steps": 1' in stdout


def test_translate_arguments_and_stdin_keep_order(trained_dir, capsys, monkeypatch):
    code, stdout, _ = run(
        ["translate", "--model", trained_dir, "--beam", "2", "我們試試看！", "", "好"], capsys
    )
    assert code == 0 and len(stdout.split("\n")) == 4 and stdout.split("\n")[1] == ""
    code, from_stdin, _ = run(
        ["translate", "--model", trained_dir, "--beam", "2"],
        capsys,
        stdin="我們試試看！\n\n好\n".encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 0 and from_stdin == stdout


def test_translate_from_stdin_gives_each_call_parallel_batches(capsys, monkeypatch):
    """With --parallel N, stdin's lines go to the runner N x --batch-size at a time (what has
    arrived): a call of one batch would leave N - 1 of its threads idle."""
    from kformer.decode.text_batches import Translation
    from kformer.export import formats

    calls, opened = [], {}

    class Recorder:
        def translations(self, lines, options=None):
            calls.append(len(lines))
            return [Translation(line.upper(), 0.0, ()) for line in lines]

    def open_runner(path, runtime="keras", variant="fp32", settings=None, options=None, weights="best"):
        opened["settings"] = settings
        return Recorder()

    monkeypatch.setattr(formats, "open_runner", open_runner)
    lines = "".join(f"line {i}\n" for i in range(10))
    argv = ["translate", "--model", "X", "--batch-size", "2", "--parallel", "2", "--runtime", "onnx"]
    code, stdout, _ = run(argv, capsys, stdin=lines.encode(), monkeypatch=monkeypatch)
    assert code == 0 and stdout.split("\n")[:-1] == [f"LINE {i}" for i in range(10)]
    assert calls == [4, 4, 2] and opened["settings"].parallel == 2


def test_translate_nbest_in_jsonl_and_text(trained_dir, capsys, monkeypatch):
    import json

    argv = ["translate", "--model", trained_dir, "--beam", "2", "--nbest", "2", "--no-repeat-ngram", "2"]
    code, stdout, _ = run([*argv, "--format", "jsonl", "我們試試看！好。", ""], capsys)
    results = [json.loads(line) for line in stdout.splitlines()]
    assert code == 0 and [sorted(r) for r in results] == [["alternatives", "score", "translation"]] * 2
    first = results[0]
    assert first["alternatives"][0] == {"translation": first["translation"], "score": first["score"]}
    assert results[1] == {
        "translation": "",
        "score": 0.0,
        "alternatives": [{"translation": "", "score": 0.0}],
    }
    code, text, _ = run([*argv, "我們試試看！好。"], capsys)
    lines = [line.split(" ||| ") for line in text.splitlines()]
    assert code == 0 and [(r, t) for r, t, _ in lines] == [
        (str(i), a["translation"]) for i, a in enumerate(first["alternatives"])
    ]


def test_translate_refuses_a_line_over_max_chars_naming_it(trained_dir, capsys, monkeypatch):
    code, out, err = run(
        ["translate", "--model", trained_dir, "--max-chars", "10", "--batch-size", "1"],
        capsys,
        stdin="好\n我們試試看我們試試看！\n".encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 2 and len(out.splitlines()) == 1  # the line before it is translated
    assert "<stdin> line 2 has 11 characters, more than --max-chars 10" in err


def test_translate_invalid_utf8_on_stdin_names_the_line(trained_dir, capsys, monkeypatch):
    code, _, err = run(
        ["translate", "--model", trained_dir], capsys, stdin=b"ok\n\xff\xfe\n", monkeypatch=monkeypatch
    )
    assert code == 2 and "<stdin>:2: invalid UTF-8" in err


def test_evaluate_split_and_files(trained_dir, tmp_path, capsys):
    code, stdout, _ = run(
        ["evaluate", "--model", trained_dir, "--split", "dev", "--beam", "1", "--limit", "4"], capsys
    )
    assert code == 0 and "BLEU" in stdout and "nrefs:" in stdout and "chrF" in stdout
    assert (
        len(open(os.path.join(trained_dir, "hypotheses.dev.txt"), encoding="utf-8").read().splitlines()) == 4
    )
    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    source.write_text("我們試試看！\n好\n", encoding="utf-8")
    reference.write_text("Let's try.\nGood.\n", encoding="utf-8")
    output = str(tmp_path / "hyp.txt")
    code, stdout, _ = run(
        [
            "evaluate",
            "--model",
            trained_dir,
            "--source",
            str(source),
            "--reference",
            str(reference),
            "--output",
            output,
        ],
        capsys,
    )
    assert code == 0 and "nrefs:1" in stdout and len(open(output).read().splitlines()) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["translate", "--model", "/nonexistent/run", "x"], "config.json not found"),
        (
            ["train", "--config", "tiny", "--data", "/nonexistent.tsv", "--out", "{tmp}/r", "--steps", "1"],
            "/nonexistent.tsv: cannot read",
        ),
        (
            ["evaluate", "--model", "{trained}", "--source", "/nonexistent.txt"],
            "give both --source and --reference",
        ),
        (["translate", "--model", "{trained}", "--max-len", "500", "x"], "max length must be"),
        (
            ["translate", "--model", "{tmp}", "--runtime", "savedmodel", "--variant", "int8", "x"],
            "--variant int8 does not exist for savedmodel",
        ),
        (
            ["translate", "--model", "{tmp}", "--runtime", "tflite", "--variant", "int8-ort", "x"],
            "--variant int8-ort does not exist for tflite",
        ),
        (
            ["translate", "--model", "{trained}", "--variant", "int8", "x"],
            "--variant int8 needs an exported runtime",
        ),
        (
            ["translate", "--model", "{trained}", "--parallel", "2", "x"],
            "--parallel 2 needs an exported runtime",
        ),
        (
            ["translate", "--model", "{trained}", "--beam", "2", "--nbest", "3", "x"],
            "nbest 3 is more than the beam size 2",
        ),
        (
            ["translate", "--model", "{trained}", "--beam", "1", "--nbest", "2", "x"],
            "nbest 2 is more than the beam size 1",
        ),
        (
            ["evaluate", "--model", "{trained}", "--split", "dev", "--output", "{tmp}"],
            "is a folder; give a file name",
        ),
        (
            ["evaluate", "--model", "{trained}", "--split", "dev", "--output", "{tmp}/no/such/h.txt"],
            "cannot write in",
        ),
        (["export", "--model", "{trained}", "--out", "{trained}/config.json"], "is not an empty folder"),
        (
            ["train", "--config", "tiny", "--out", "{trained}/config.json", "--steps", "1"],
            "is a file, not a folder",
        ),
    ],
)
def test_errors_are_one_clear_line(argv, message, tmp_path, trained_dir, capsys):
    argv = [a.format(tmp=tmp_path, trained=trained_dir) for a in argv]
    code, _, err = run(argv, capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_missing_optional_extra_is_one_line_naming_it(trained_dir, tmp_path, capsys, monkeypatch):
    import kformer

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if `pip install kformer` without [plots]
    monkeypatch.delitem(sys.modules, "kformer.plots", raising=False)
    monkeypatch.delattr(kformer, "plots", raising=False)
    code, _, err = run(["attention", "--model", trained_dir, "--out", str(tmp_path / "a.png"), "好"], capsys)
    assert code == 2 and err.strip().splitlines()[-1] == (
        "kformer attention: error: this command needs matplotlib, which is not installed: pip install 'kformer[plots]'"
    )


def test_each_optional_module_is_named_with_its_extra():
    from kformer.extras import extra_for

    found = {
        module: extra_for(module)
        for module in (
            "tf2onnx",
            "onnxruntime",
            "ai_edge_litert",
            "tensorflow_text",
            "matplotlib.pyplot",
            "keras_hub",
            "ctranslate2",
            "pytest",
            "numpy",
            "tensorflow",
        )
    }
    assert found == {
        "tf2onnx": "export",
        "onnxruntime": "export",
        "ai_edge_litert": "export",
        "tensorflow_text": "export",
        "matplotlib.pyplot": "plots",
        "keras_hub": "bench",
        "ctranslate2": "ctranslate2",
        "pytest": "test",
        "numpy": None,
        "tensorflow": None,
    }


@pytest.mark.parametrize(
    "argv, option",
    [
        (["train", "--out", "X", "--minutes", "0"], "--minutes"),
        (["train", "--out", "X", "--minutes", "-5"], "--minutes"),
        (["train", "--out", "X", "--minutes", "nan"], "--minutes"),
        (["train", "--out", "X", "--steps", "-1"], "--steps"),
        (["train", "--out", "X", "--epochs", "0"], "--epochs"),
        (["train", "--out", "X", "--save-minutes", "0"], "--save-minutes"),
        (["demo", "--minutes", "0"], "--minutes"),
        (["translate", "--model", "X", "--beam", "0", "hi"], "--beam"),
        (["translate", "--model", "X", "--batch-size", "-1", "hi"], "--batch-size"),
        (["translate", "--model", "X", "--alpha", "nan", "hi"], "--alpha"),
        (["translate", "--model", "X", "--alpha", "-0.5", "hi"], "--alpha"),
        (["translate", "--model", "X", "--max-len", "0", "hi"], "--max-len"),
        (["translate", "--model", "X", "--no-repeat-ngram", "-1", "hi"], "--no-repeat-ngram"),
        (["translate", "--model", "X", "--nbest", "0", "hi"], "--nbest"),
        (["export", "--model", "X", "--out", "Y", "--no-repeat-ngram", "-1"], "--no-repeat-ngram"),
        (["evaluate", "--model", "X", "--limit", "0"], "--limit"),
    ],
)
def test_bad_numbers_are_refused_before_any_work(tmp_path, capsys, monkeypatch, argv, option):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and f"argument {option}:" in err
    assert not os.path.exists("X")


def test_the_installed_command_streams_translations_line_by_line(trained_dir):
    """The console script, as a user runs it: each piped line's translation arrives before the next
    line is sent (nothing is held back for a full --batch-size batch or the end of the input);
    errors are one line, exit 2."""
    import select
    import shutil
    import subprocess

    command = shutil.which("kformer", path=os.path.dirname(sys.executable))
    process = subprocess.Popen(  # fed a line at a time: no helper waits for the end
        [command, "translate", "--model", trained_dir],  # the default --batch-size, 32
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    outputs = []
    for line in ["我們試試看！", "", "好"]:
        process.stdin.write((line + "\n").encode())
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], 60)  # this line's translation, before the next
        if not ready:
            process.kill()
            pytest.fail(f"no translation of {line!r} within 60 s: the output is held back")
        outputs.append(process.stdout.readline())
    process.stdin.close()
    assert process.wait(timeout=120) == 0 and process.stdout.read() == b""
    assert len(outputs) == 3 and outputs[1] == b"\n" and all(o.endswith(b"\n") for o in outputs)
    failed = run_process([command, "translate", "--model", "/nonexistent", "x"])
    assert failed.status == 2 and failed.stdout == ""
    assert failed.stderr.strip().splitlines() == [
        "kformer translate: error: /nonexistent/config.json not found: is /nonexistent a kformer training directory?"
    ]


def test_each_benchmark_is_a_subcommand_with_its_own_options(capsys, monkeypatch):
    """`kformer bench NAME`: a benchmark takes the options of its module and refuses another's; one
    that needs a model says so in argparse's one line, before any work."""
    from kformer import bench

    for name in bench.BENCHMARKS:
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", name, "--help"])
        assert exit_info.value.code == 0 and f"usage: kformer bench {name}" in capsys.readouterr().out
    called = []
    monkeypatch.setattr("kformer.bench.decode.bench_decode", lambda model: called.append(model) or {})
    monkeypatch.setattr("kformer.bench.decode.print_decode_table", lambda results: None)
    assert main(["bench", "decode", "--model", "runs/demo"]) == 0 and called == ["runs/demo"]
    for argv, message in (
        (["bench", "decode", "--model", "M", "--runtimes", "onnx"], "unrecognized arguments: --runtimes"),
        (["bench", "runtimes"], "the following arguments are required: --model"),
        (["bench", "serve", "--model", "M", "--parallel", "0"], "argument --parallel:"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


def test_an_argument_that_is_not_utf8_is_one_line_naming_it(trained_dir):
    """A byte that is not UTF-8 in argv (Python reads it as a lone surrogate) is refused in one line
    naming the argument, before any work."""
    ran = run_process([*KFORMER, "translate", "--model", trained_dir, b"\xe5\xa5\xbd\xff"])
    assert ran.status == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert ran.stderr.strip().splitlines()[-1] == (
        "kformer translate: error: argument 4 (好\\xff) is not valid UTF-8 (byte 0xff at 3); "
        "kformer reads its arguments as UTF-8"
    )


def test_a_truncated_training_position_is_recovered_or_refused_naming_the_file(tmp_path, corpus_tsv, capsys):
    """A run whose batch-stream position (input-STEPS.*) was cut short resumes from its checkpoint,
    rebuilding the batches already trained on, and says so; a cut training.json is refused in one
    line naming the file to remove."""
    out = str(tmp_path / "run")
    argv = ["train", "--config", "tiny", "--data", corpus_tsv, "--out", out, "--vocab-size", "1200"]
    assert run([*argv, "--steps", "3"], capsys)[0] == 0
    position = os.path.join(out, "input-3.data-00000-of-00001")
    with open(position, "r+b") as f:
        f.truncate(10)
    code, stdout, err = run([*argv, "--steps", "5"], capsys)
    assert code == 0 and '"steps": 5' in stdout and "Traceback" not in err, err
    assert "input-3 cannot be read" in err and "rebuilding the 3 batches" in err, err
    with open(os.path.join(out, "training.json"), "r+b") as f:
        f.truncate(20)
    code, _, err = run([*argv, "--steps", "6"], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and "training.json: not valid JSON" in line and "remove it" in line, err
    os.remove(os.path.join(out, "training.json"))
    code, stdout, err = run([*argv, "--steps", "6"], capsys)
    assert code == 0 and '"steps": 6' in stdout, err


def test_a_run_whose_corpus_held_nothing_out_evaluates_and_exports_as_it_can(tmp_path, corpus_tsv, capsys):
    """A corpus too small to hold pairs out (here --split-size 0): `evaluate` without files is one
    line saying to give them, and the export checks its files on the probe texts."""
    from kformer.data.prepare import PrepareOptions, prepare
    from kformer.export.verify import PROBE_TEXTS, check_sentences
    from kformer.train.fit import train
    from kformer.train.options import Evaluation

    prepared, out = str(tmp_path / "prepared"), str(tmp_path / "run")
    prepare(corpus_tsv, prepared, PrepareOptions(vocab_size=1200, split_size=0))
    train(out, "tiny", data=prepared, steps=1, xla=False, verbose=0, evaluation=Evaluation(0))
    assert main(["evaluate", "--model", out]) == 2
    assert "test split is empty: its corpus was too small to hold pairs out" in capsys.readouterr().err
    assert check_sentences(out)[0] == PROBE_TEXTS
