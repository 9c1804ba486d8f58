"""`kformer bench argos`: the real Argos Translate on an export's package against kformer's own
CTranslate2 runner on the same weights, over the test split of the corpus the model was trained
on: BLEU of each and the share of lines they translate alike.

Argos decodes with its settings: beam 4, length penalty 0.2, CTranslate2's "auto" compute type
(int8 on most CPUs), at most 256 tokens, its own sentence splitting and detokenizing. kformer's
runner uses the export's: its beam and alpha, the package's weights (fp32 or int8), at most the
source's length + 50 tokens. Argos runs in the venv `make test` installs it in (Makefile:
ARGOS_VENVS), offline."""

import json
import os
import subprocess
import sys
import tempfile

from kformer.arguments import positive
from kformer.bench.harness import Stopwatch, print_table, report
from kformer.contracts.export import ExportManifest

HELP = "Argos Translate against kformer's CTranslate2 runner on an export's Argos package"
ARGOSTRANSLATE = "argostranslate"  # the venv of PyPI argostranslate==1.11.0, inside kformer's
TRANSLATE = """
import json, sys
import argostranslate.package, argostranslate.translate
for path in sys.argv[1:]:
    argostranslate.package.install_from_path(path)
job = json.load(sys.stdin)
print(json.dumps({
    direction: [argostranslate.translate.translate(t, *direction.split("-")) for t in texts]
    for direction, texts in job.items()
}))
"""


def argos_python(venv=ARGOSTRANSLATE):
    """The Python of the venv `make test` installs `venv` in, inside the running one."""
    return os.path.join(sys.prefix, venv, "bin", "python")


def offline_environment(home):
    """A fresh home for Argos's data and caches, and a proxy that refuses every connection: what a
    package needs from the internet fails instead of being fetched."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("ARGOS")}
    env.update(HOME=str(home), XDG_DATA_HOME=os.path.join(home, "data"), HF_HUB_OFFLINE="1")
    env.update(XDG_CONFIG_HOME=os.path.join(home, "config"), XDG_CACHE_HOME=os.path.join(home, "cache"))
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = "http://127.0.0.1:9"
    return env


def argos_translations(python, packages, job, home):
    """{direction ("zh-en"): translations of job[direction]} from Argos in `python`, with the
    `packages` (.argosmodel files) installed into the fresh `home`, offline."""
    result = subprocess.run(
        [python, "-c", TRANSLATE, *packages],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=offline_environment(home),
    )
    if result.returncode:
        raise RuntimeError(f"Argos failed ({python}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def bench_argos(export_dir, python, sentences=None):
    """Both on the first `sentences` test sources (all by default); a JSON-friendly dict."""
    from kformer.evaluate import evaluate, score, split_references
    from kformer.export.formats import open_listed

    manifest = ExportManifest.load(export_dir)
    if not manifest.packages:
        raise ValueError(f"{export_dir} holds no Argos package: export it with --formats argos")
    if not os.path.exists(python):
        raise ValueError(f"{python} not found: `make test` installs argostranslate in a venv of its own")
    direction, package = str(manifest.pair), manifest.packages[0]
    sources, references = (found[:sentences] for found in split_references(manifest.trained_in, "test"))
    runner = open_listed(export_dir, "ctranslate2", package.variant)  # the export's beam and alpha
    with Stopwatch() as ours_watch:
        ours = evaluate(runner, sources, references)
    with Stopwatch() as theirs_watch, tempfile.TemporaryDirectory() as home:
        theirs = argos_translations(
            python, [os.path.join(export_dir, package.file)], {direction: sources}, home
        )[direction]
    translations = [hypothesis for _, _, hypothesis in ours["examples"]]
    return {
        "export": os.path.abspath(export_dir),
        "direction": direction,
        "sentences": len(sources),
        "kformer": _scored(ours, ours_watch.seconds),
        # with Argos's start and the package's install
        "argos": _scored(score(theirs, references, runner.language), theirs_watch.seconds),
        "identical": sum(a == b for a, b in zip(translations, theirs)) / len(sources),
        "examples": [list(row) for row in zip(sources, translations, theirs)][:5],
    }


def _scored(found, seconds):
    return {"bleu": round(found["bleu"], 2), "chrf": round(found["chrf"], 2), "seconds": round(seconds, 1)}


def print_argos_table(results):
    names = (("kformer", "kformer ctranslate2"), ("argos", "Argos Translate"))
    columns = [
        ("", "<24", "name"),
        ("BLEU", "6.2f", "bleu"),
        ("chrF", "6.2f", "chrf"),
        ("seconds", "8.1f", "seconds"),
    ]
    print_table(
        columns,
        [{"name": label, **results[name]} for name, label in names],
        title=f"{results['direction']}, {results['sentences']} test sentences of {results['export']}",
    )
    print(f"identical lines: {results['identical']:.1%} (Argos's seconds include its start and the install)")


def add_arguments(p):
    p.add_argument("--model", required=True, help="a `kformer export` folder with an Argos package")
    p.add_argument("--sentences", type=positive(int), help="only the first N test sentences")
    p.add_argument("--argos-python", default=argos_python(), help="the Python of argostranslate's venv")


def main(args):
    report(bench_argos(args.model, args.argos_python, args.sentences), print_argos_table, args.json)
