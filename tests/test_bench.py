"""Smoke tests of the benchmarks (tiny model, few tokens): they run and report consistent
numbers. No timing is asserted; the benchmarks themselves print ratios measured in one run."""

import json

import pytest

from export.benchmark import worker
from kformer.bench import bench_decode
from test_export import BEAM, artifacts, model_dir  # noqa: F401  (fixtures)


def test_bench_decode_reports_every_variant(model_dir):  # noqa: F811
    results = bench_decode(model_dir, batch_sizes=(1, 2), output_tokens=6, repeats=1)
    rows = results["rows"]
    assert len(rows) == 2 * 2 * 4  # batch sizes x searches x (cached, cached_xla, naive, naive_eager)
    assert {r["variant"] for r in rows} == {"cached", "cached_xla", "naive", "naive_eager"}
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 6 / r["seconds"])
        assert r["speedup_vs_naive"] > 0
    assert all(r["speedup_vs_naive"] == 1.0 for r in rows if r["variant"] == "naive")


def test_runtime_worker_measures_one_runtime(artifacts, tmp_path):  # noqa: F811
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"sources": ["我們試試看！", "他很高興。", "好"], "latency_index": 1}))
    row = worker(artifacts, "tflite", "fp32", BEAM, str(job), repeats=2)
    assert row["search"] == f"beam{BEAM}" and len(row["hypotheses"]) == 3
    assert row["latency_ms"] > 0 and row["batch32_sentences_per_s"] > 0 and row["peak_rss_mb"] > 0
