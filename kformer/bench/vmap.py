"""`kformer bench vmap`: what CTranslate2's vocabulary mapping buys at a large vocabulary. The
export's CTranslate2 file translates the same sentences with `use_vmap` off and on, greedy and
beam, a file (batches of 32, as the runners) and one sentence at a time, in interleaved rounds.
With the map, each batch's output projection covers only the target pieces its source pieces
allow (and those always allowed): the anchor for a vocabulary shortlist of kformer's own.

The map is CTranslate2's `vmap.txt` (a source piece, a tab, the target pieces it allows separated
by spaces; an empty source piece: those always allowed): --vmap FILE, or counted from --pairs:
each source piece's `per_source` target pieces of highest Dice coefficient (pairs holding both,
twice, over pairs holding either) and the `frequent` commonest target pieces."""

import collections
import os
import shutil
import statistics
import tempfile

from kformer.arguments import add_rounds_option, positive
from kformer.bench.harness import Stopwatch, interleave, print_table, reduced, report, spread
from kformer.contracts.export import ExportManifest
from kformer.data import corpus as corpus_lib
from kformer.data.vocabulary import maps_through_vocabulary, open_tokenizer
from kformer.decode.options import EXTRA_OUTPUT_TOKENS, search_label

VMAP_FILE = "vmap.txt"  # the name CTranslate2 reads in its model folder


def _pieces(tokenizer, side, text):
    """The pieces of `text` on `side` ("source" or "target") of an export's tokenizer that its
    vocabulary holds (CTranslate2's tokens)."""
    model = getattr(tokenizer, side) if maps_through_vocabulary(tokenizer) else tokenizer
    pieces = model.encode(text, out_type=str)
    return [p for p in pieces if tokenizer.piece_to_id(p) != tokenizer.unk_id()]


def count_vmap(tokenizer, pairs, per_source=20, frequent=100):
    """{source piece: [target pieces]} ("" -> the `frequent` commonest target pieces) counted from
    `pairs` [(source, target)] through `tokenizer` (see the module's docstring)."""
    both, sources, targets = collections.Counter(), collections.Counter(), collections.Counter()
    for source, target in pairs:
        s, t = set(_pieces(tokenizer, "source", source)), set(_pieces(tokenizer, "target", target))
        sources.update(s)
        targets.update(t)
        both.update((a, b) for a in s for b in t)
    allowed = collections.defaultdict(list)
    for (a, b), count in both.items():
        allowed[a].append((2 * count / (sources[a] + targets[b]), b))
    vmap = {a: [b for _, b in sorted(found, reverse=True)[:per_source]] for a, found in allowed.items()}
    vmap[""] = [b for b, _ in targets.most_common(frequent)]
    return vmap


def write_vmap(vmap, path):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{source}\t{' '.join(targets)}\n" for source, targets in vmap.items())


def read_vmap(path):
    """{source piece: [target pieces]} of a vmap.txt."""
    with open(path, encoding="utf-8") as f:
        return {
            source: targets.split()
            for source, _, targets in (line.rstrip("\n").partition("\t") for line in f)
        }


def _kept(vmap, rows):
    """How many target pieces the map allows for `rows` (source pieces) translated together."""
    return len(set(vmap.get("", [])).union(*(vmap.get(piece, []) for row in rows for piece in row)))


def _with_vmap(folder, vmap_file, work):
    """A folder in `work` of links to the model files in `folder`, and the map as vmap.txt (the
    export's folder stays as its manifest's sha256 has it)."""
    linked = os.path.join(work, "with-vmap")
    os.makedirs(linked)
    for name in os.listdir(folder):
        if name != VMAP_FILE:  # a map of its own stays out: the link would be written through
            os.symlink(os.path.abspath(os.path.join(folder, name)), os.path.join(linked, name))
    shutil.copyfile(vmap_file, os.path.join(linked, VMAP_FILE))
    return linked


def _translated(translator, rows, beam, manifest, use_vmap, batch_size):
    """(seconds, output tokens) of translating `rows` (source pieces) in one call of batches."""
    longest = max(map(len, rows))
    with Stopwatch() as watch:
        results = translator.translate_batch(
            rows,
            max_batch_size=batch_size,
            beam_size=beam,
            length_penalty=manifest.alpha if beam > 1 else 0.0,
            no_repeat_ngram_size=max(0, manifest.no_repeat_ngram),
            max_decoding_length=min(longest + EXTRA_OUTPUT_TOKENS, manifest.max_length),
            min_decoding_length=0,
            use_vmap=use_vmap,
        )
    return watch.seconds, sum(len(r.hypotheses[0]) for r in results)


def _measure(translators, rows, singles, manifest, batch_size):
    """measure(variant, round) for `interleave`: variant = (use_vmap, beam)."""

    def measure(variant, _):
        use_vmap, beam = variant
        translator = translators[use_vmap]
        size = batch_size if beam == 1 else max(1, batch_size // beam)
        file_s, file_tokens = _translated(translator, rows, beam, manifest, use_vmap, size)
        single = [_translated(translator, [row], beam, manifest, use_vmap, 1) for row in singles]
        return {
            "file_s": file_s,
            "file_tokens": file_tokens,
            "batch1_ms": 1000 * statistics.mean(s for s, _ in single),
            "batch1_tokens": statistics.mean(t for _, t in single),
        }

    return measure


def bench_vmap(artifact_dir, sources, vmap_file, variant="fp32", rounds=3, progress=print, **sizes):
    """{"rows": a row per search and use_vmap, "vs_off": time with the map / without, round by
    round, ...} for the export's CTranslate2 `variant` translating `sources` (texts).
    `sizes`: batch_size (32), singles (sentences timed one at a time, 20)."""
    import ctranslate2

    manifest = ExportManifest.load(artifact_dir)
    folder = os.path.join(artifact_dir, manifest.artifact("ctranslate2", variant).file)
    tokenizer = open_tokenizer(artifact_dir, manifest.tokenizer.file)
    rows = [[tokenizer.id_to_piece(i) for i in ids] for ids in tokenizer.encode(list(sources))]
    if not rows:
        raise ValueError("no sentences to translate: --source is empty")
    batch_size, singles = sizes.get("batch_size", 32), rows[: sizes.get("singles", 20)]
    with tempfile.TemporaryDirectory() as work:
        translators = {
            use_vmap: ctranslate2.Translator(_with_vmap(folder, vmap_file, work) if use_vmap else folder)
            for use_vmap in (False, True)
        }
        variants = {
            f"{'vmap' if v else 'full'} beam {b}": (v, b)
            for b in (1, manifest.beam_size)
            for v in (False, True)
        }
        measure = _measure(translators, rows, singles, manifest, batch_size)
        found = interleave(variants, rounds, measure, progress, lambda r: f"{r['batch1_ms']:.0f} ms at b1")
    vmap = read_vmap(vmap_file)
    kept = {"vocabulary": tokenizer.get_piece_size(), "file": _kept(vmap, rows)}
    kept["single"] = statistics.mean(_kept(vmap, [row]) for row in singles)
    return {**_results(found, variants, rows, singles, variant, rounds), "kept": kept}


def _results(found, variants, rows, singles, variant, rounds):
    results = {
        "variant": variant,
        "sentences": len(rows),
        "singles": len(singles),
        "rounds": rounds,
        "rows": [],
    }
    for label, (use_vmap, beam) in variants.items():
        measured = found[label]
        row = {"search": search_label(beam), "vmap": bool(use_vmap), **reduced(measured, medians=measured[0])}
        if use_vmap:
            off = found[label.replace("vmap", "full")]
            row["vs_off"] = {
                key: spread([m[key] for m in measured], [m[key] for m in off])[0]
                for key in ("file_s", "batch1_ms")
            }
        results["rows"].append(row)
    return results


def print_vmap_table(results):
    title = (
        f"CTranslate2 {results['variant']}, use_vmap off and on: a file of {results['sentences']} sentences "
        f"(batches of 32, beam: 32 / K) and the first {results['singles']} one at a time; medians of "
        f"{results['rounds']} interleaved rounds; time with the map / without, round by round; "
        "target pieces the map allows (besides CTranslate2's specials) of {vocabulary:,}: {single:,.0f} "
        "a sentence alone on average, {file:,} for the whole file".format(**results["kept"])
    )
    columns = [
        ("search", ">6", "search"),
        ("vmap", ">5", lambda r: "on" if r["vmap"] else "off"),
        ("file s", "7.2f", "file_s"),
        ("out tok", "7.0f", "file_tokens"),
        ("ms@b1", "7.1f", "batch1_ms"),
        ("tok@b1", "6.1f", "batch1_tokens"),
        (
            "/off file, b1",
            ">13",
            lambda r: "-" if "vs_off" not in r else "{file_s:.2f}, {batch1_ms:.2f}".format(**r["vs_off"]),
        ),
    ]
    print_table(columns, results["rows"], title=title)


HELP = "CTranslate2's vocabulary mapping (use_vmap) against its full output, on an export's file"


def add_arguments(p):
    p.add_argument("--model", required=True, help="a `kformer export` folder with --formats ctranslate2")
    p.add_argument("--source", required=True, help="the sentences to translate, one a line")
    p.add_argument("--sentences", type=positive(int), default=200, help="the first N of them (200)")
    p.add_argument("--vmap", help="a vmap.txt (CTranslate2's format); or count one from --pairs")
    p.add_argument("--pairs", help="a TSV of source<TAB>target pairs to count the map from")
    p.add_argument(
        "--per-source", type=positive(int), default=20, help="target pieces a source piece allows (20)"
    )
    p.add_argument("--frequent", type=positive(int), default=100, help="target pieces always allowed (100)")
    p.add_argument("--variant", default="fp32", help="the CTranslate2 file: fp32 or int8 (fp32)")
    add_rounds_option(p)


def _read_pairs(path):
    """[(source, target)] of a TSV, as written (a vmap counts every pair, copies included)."""
    pairs = []
    for number, line in enumerate(corpus_lib.read_text_file(path), 1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected source<TAB>target, found {len(fields)} fields")
        pairs.append(tuple(fields))
    return pairs


def main(args):
    if (args.vmap is None) == (args.pairs is None):
        raise ValueError("give --vmap FILE or --pairs TSV (to count one), not both")
    sources = corpus_lib.read_text_file(args.source)[: args.sentences]
    with tempfile.TemporaryDirectory() as work:
        vmap_file = args.vmap
        if vmap_file is None:
            manifest = ExportManifest.load(args.model)
            tokenizer = open_tokenizer(args.model, manifest.tokenizer.file)
            vmap = count_vmap(tokenizer, _read_pairs(args.pairs), args.per_source, args.frequent)
            vmap_file = os.path.join(work, VMAP_FILE)
            write_vmap(vmap, vmap_file)
        results = bench_vmap(args.model, sources, vmap_file, args.variant, args.rounds)
    report(results, print_vmap_table, args.json)
