"""`kformer serve`: its two APIs against the runner's own translations, real LibreTranslate clients
from PyPI, batching across requests, bad requests, a full queue, clients that leave, SIGTERM."""

import asyncio
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import BEAM, KFORMER, manifest_edited, run_kformer

from kformer.decode.options import SearchOptions
from kformer.decode.runner import RunnerSettings
from kformer.export.formats import open_runner
from kformer.serve import app as app_lib
from kformer.serve.app import create_app
from kformer.serve.server import serving
from kformer.serve.settings import Settings

TEXTS = ["我們試試看！", "他很高興。你呢？", "", "好"]


@pytest.fixture(scope="module")
def runner(artifacts):
    return open_runner(artifacts, "onnx", "fp32")


@pytest.fixture(scope="module")
def url(runner):
    with serving(create_app(runner)) as url:
        yield url


def request(url, body=None, content_type="application/json", method=None, headers=()):
    """(status, headers, parsed JSON or text) of one request; body: a dict (sent as JSON) or bytes."""
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body
    sent = urllib.request.Request(url, data=data, method=method, headers=dict(headers))
    if data is not None and content_type:
        sent.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(sent, timeout=60) as response:
            status, answer_headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        status, answer_headers, raw = e.code, e.headers, e.read()
    kind = answer_headers.get("Content-Type", "")
    return status, answer_headers, json.loads(raw) if kind.startswith("application/json") else raw.decode()


def test_kformer_api_answers_as_the_runner_does(runner, url):
    for options in ({}, {"nbest": 2}, {"beam_size": 1, "max_length": 5, "no_repeat_ngram": 0}):
        status, _, answer = request(url + "v1/translate", {"texts": TEXTS, **options})
        expected = [t.to_dict() for t in runner.translations(TEXTS, SearchOptions(**options))]
        assert status == 200 and answer == {"translations": expected}, options
    status, _, health = request(url + "health")
    assert status == 200 and health["status"] == "ready" and health["direction"] == "zh-en"


def test_answers_are_not_held_back_by_nagles_algorithm(url):
    """A response is two writes (headers, body); with Nagle's algorithm on, the second waits for
    the client's delayed ACK. The server's end of a connection has it off (TCP_NODELAY), which
    asyncio sets only on sockets that say they are TCP (kformer.serve.server.bind)."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    for _ in range(2):  # the second on the connection the first left open
        connection.request("GET", "/health")
        response = connection.getresponse()
        health = json.loads(response.read())
        assert response.status == 200 and (health["status"], health["direction"]) == ("ready", "zh-en")
    assert server_end_option(connection.sock, socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    connection.close()


def server_end_option(client, level, option):
    """The socket option of the server's end of the connected socket `client`: the socket of this
    process (the server runs in a thread) whose peer is `client`."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                continue
            with socket.socket(fileno=os.dup(int(name))) as found:  # closes the duplicate only
                if found.getpeername() == client.getsockname():
                    return found.getsockopt(level, option)
        except OSError:  # closed since listed, or not connected
            continue
    pytest.fail(f"no socket of this process is connected to {client.getsockname()}")


def test_libretranslate_clients_from_pypi_work_unchanged(runner, url):
    from deep_translator import LibreTranslator
    from libretranslatepy import LibreTranslateAPI

    client = LibreTranslateAPI(url)  # a URL-encoded form body
    assert client.translate(TEXTS[1], "zh", "en") == runner.translate([TEXTS[1]])[0]
    assert client.languages() == [{"code": "zh", "name": "Chinese", "targets": ["en"]}]
    [detected] = client.detect(TEXTS[0])
    assert detected["language"] == "zh" and 0 <= detected["confidence"] <= 100
    # deep-translator sends the fields in the query string and insists on a key, which is ignored
    # while the server has none
    translator = LibreTranslator(source="zh", target="en", api_key="unused", custom_url=url)
    assert translator.translate(TEXTS[0]) == runner.translate([TEXTS[0]])[0]


@pytest.mark.parametrize(
    ("runtime", "variant"), [("tflite", "fp32"), ("tflite", "text"), ("ctranslate2", "fp32")]
)
def test_every_device_runtime_serves(artifacts, runtime, variant):
    runner = open_runner(artifacts, runtime, variant)
    with serving(create_app(runner)) as url:
        status, _, answer = request(url + "translate", {"q": TEXTS, "source": "zh", "target": "en"})
        health = request(url + "health")[2]
        alternatives = request(
            url + "translate", {"q": TEXTS[1], "source": "zh", "target": "en", "alternatives": 2}
        )
    assert status == 200 and answer == {"translatedText": runner.translate(TEXTS)}
    assert health["runtime"] == runtime
    expected = runner.translations([TEXTS[1]], SearchOptions(nbest=3))[0].alternatives
    assert alternatives[2]["alternatives"] == [h.text for h in expected[1:3]]


def test_libretranslate_api_shapes(runner, url):
    status, _, answer = request(
        url + "translate", {"q": TEXTS[:2], "source": "auto", "target": "en", "alternatives": 2}
    )
    best = runner.translations(TEXTS[:2], SearchOptions(nbest=3))
    assert status == 200 and answer["translatedText"] == [t.text for t in best]
    assert answer["alternatives"] == [[h.text for h in t.alternatives[1:3]] for t in best]
    assert [d["language"] for d in answer["detectedLanguage"]] == ["zh", "zh"]
    status, _, answer = request(
        url + "translate", b"q=%E5%A5%BD&source=zh&target=en", "application/x-www-form-urlencoded"
    )
    assert status == 200 and answer == {"translatedText": runner.translate(["好"])[0]}
    for body, message in [
        ({"source": "zh", "target": "en"}, "Invalid request: missing q parameter"),
        ({"q": "好", "target": "en"}, "Invalid request: missing source parameter"),
        ({"q": "好", "source": "zh", "target": "fr"}, "fr is not supported"),
        (
            {"q": 3, "source": "zh", "target": "en"},
            "Invalid request: q must be a string or a list of strings",
        ),
        ({"q": "好", "source": "zh", "target": "en", "format": "xml"}, "xml format is not supported"),
        (
            {"q": "好", "source": "zh", "target": "en", "format": "html", "alternatives": 1},
            "not given for format html",
        ),
        ({"q": "好", "source": "zh", "target": "en", "alternatives": BEAM}, f"at most {BEAM - 1}"),
        (
            {"q": "好", "source": "zh", "target": "en", "alternatives": "x"},
            "alternatives must be a whole number",
        ),
    ]:
        status, _, answer = request(url + "translate", body)
        assert status == 400 and set(answer) == {"error"} and message in answer["error"], (body, answer)


def test_bad_requests_get_a_4xx_naming_the_fault_and_the_server_goes_on(runner, url):
    api = url + "v1/translate"
    for body, content_type, status, words in [
        (b'{"texts": ["a"', "application/json", 400, "not valid JSON"),
        (b'["a"]', "application/json", 400, "must be a JSON object"),
        (b'{"texts": ["\xff\xfe"]}', "application/json", 400, "not valid UTF-8"),
        ({"text": ["a"]}, "application/json", 400, "unknown field 'text'"),
        ({"beam": 4}, "application/json", 400, "unknown field 'beam'"),
        ({"alpha": 1}, "application/json", 400, "missing field 'texts'"),
        ({"texts": "好"}, "application/json", 400, "'texts' must be a list of strings"),
        ({"texts": ["好", 3]}, "application/json", 400, "'texts' must be a list of strings"),
        ({"texts": ["好"], "beam_size": 2}, "application/json", 400, f"beam size {BEAM}, not 2"),
        ({"texts": ["好"], "alpha": -1}, "application/json", 400, "alpha"),
        ({"texts": ["好"], "nbest": BEAM + 1}, "application/json", 400, "nbest"),
        ({"texts": ["好" * 10_001]}, "application/json", 413, "more than the limit 10,000"),
    ]:
        got, _, answer = request(api, body, content_type)
        assert got == status and words in answer["error"], (body if len(str(body)) < 80 else "big", answer)
    host, port = url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port))) as client:  # a 2 MiB body, refused before it is sent
        client.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n")
        refused = client.recv(4096)
        assert refused.startswith(b"HTTP/1.1 413 "), refused
    got, _, answer = request(
        url + "translate", b"q=%FF&source=zh&target=en", "application/x-www-form-urlencoded"
    )
    assert got == 400 and "not valid UTF-8" in answer["error"]
    got, _, answer = request(url + "translate", b"--x\r\n", "multipart/form-data; boundary=x")
    assert got == 415 and "URL-encoded form" in answer["error"]
    assert request(api, method="GET")[0] == 405 and request(url + "nothing/here")[0] == 404
    assert request(api, {"texts": ["好"]})[2] == {
        "translations": [t.to_dict() for t in runner.translations(["好"])]
    }
    status, _, metrics = request(url + "metrics")
    counts = re.findall(r'kformer_requests_total\{code="(\d+)",route="/v1/translate"\} (\d+)', metrics)
    assert status == 200 and ("413", "2") in counts and ("400", "11") in counts, counts


class Gated:
    """A runner whose translations wait for `gate` (so that requests queue behind a batch), and
    that records the texts of each call."""

    def __init__(self, runner):
        self.runner, self.calls, self.gate = runner, [], threading.Event()

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def translations(self, texts, options=None):
        self.calls.append(list(texts))
        assert self.gate.wait(60)
        return self.runner.translations(texts, options)


def hold_the_runner(pool, url, gated):
    """Sends one request and waits until the gated runner is busy with it, so that what is sent
    next queues behind it; returns its future."""
    held = pool.submit(request, url + "v1/translate", {"texts": ["先"]})
    while not gated.calls:
        time.sleep(0.01)
    return held


def wait_for_metric(url, line):
    """Waits until /metrics has this line (e.g. "kformer_queue_requests 3.0")."""
    while line not in request(url + "metrics")[2]:
        time.sleep(0.01)


def test_concurrent_requests_run_in_one_batch(runner):
    gated = Gated(runner)
    texts = [f"{i}。" for i in range(8)]
    with (
        serving(create_app(gated, Settings(batch_size=32))) as url,
        concurrent.futures.ThreadPoolExecutor(9) as pool,
    ):
        first = hold_the_runner(pool, url, gated)
        rest = [
            pool.submit(request, url + "translate", {"q": t, "source": "zh", "target": "en"}) for t in texts
        ]
        wait_for_metric(url, "kformer_queue_requests 8.0")
        gated.gate.set()
        assert first.result()[0] == 200
        answers = [f.result()[2]["translatedText"] for f in rest]
    assert len(gated.calls) == 2 and sorted(gated.calls[1]) == texts  # one batch, in order of arrival
    assert answers == runner.translate(texts)


def test_a_batch_holds_batch_size_texts_and_the_request_that_reaches_it(runner):
    gated = Gated(runner)
    with (
        serving(create_app(gated, Settings(batch_size=4))) as url,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        first = hold_the_runner(pool, url, gated)
        rest = [pool.submit(request, url + "v1/translate", {"texts": [f"{i}。"] * 3}) for i in range(3)]
        wait_for_metric(url, "kformer_queue_requests 3.0")
        gated.gate.set()
        assert first.result()[0] == 200 and all(f.result()[0] == 200 for f in rest)
    assert [len(call) for call in gated.calls] == [1, 6, 3]


def test_a_runner_of_parallel_batches_serves_that_many_at_once(artifacts):
    """With a runner opened with parallel=2, two requests' batches run at the same time (each waits
    for the other at a barrier, which a lone batcher thread would never pass) and both are
    answered; closing the server stops both batcher threads."""
    parallel = open_runner(artifacts, "onnx", "fp32", RunnerSettings(threads=2, parallel=2))
    barrier = threading.Barrier(2, timeout=30)

    class Together(Gated):
        def translations(self, texts, options=None):
            self.calls.append(list(texts))
            barrier.wait()
            return self.runner.translations(texts, options)

    def batchers():  # the batcher threads started by this test
        return [t for t in threading.enumerate() if t not in before and t.name.startswith("kformer-batcher")]

    together, before = Together(parallel), set(threading.enumerate())
    with (
        serving(create_app(together, Settings(batch_size=1))) as url,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        answers = list(
            pool.map(lambda text: request(url + "v1/translate", {"texts": [text]}), ["好", "走了"])
        )
        assert len(batchers()) == 2
    assert [status for status, _, _ in answers] == [200, 200] and sorted(together.calls) == [["好"], ["走了"]]
    assert [a["translations"][0]["translation"] for _, _, a in answers] == parallel.translate(["好", "走了"])
    assert not batchers()


def test_a_full_queue_answers_503_with_retry_after_and_recovers(runner):
    gated = Gated(runner)
    with (
        serving(create_app(gated, Settings(max_queue_chars=10))) as url,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        running = hold_the_runner(pool, url, gated)
        queued = pool.submit(request, url + "v1/translate", {"texts": ["一二三四五"]})  # 6 of 10 characters
        wait_for_metric(url, "kformer_queue_requests 1.0")
        status, headers, answer = request(url + "v1/translate", {"texts": ["六七八九十"]})
        assert status == 503 and int(headers["Retry-After"]) >= 1 and "queue is full" in answer["error"]
        gated.gate.set()
        assert running.result()[0] == 200 and queued.result()[0] == 200
        assert request(url + "v1/translate", {"texts": ["六七八九十"]})[0] == 200


def test_a_client_that_leaves_has_its_request_cancelled_before_the_499():
    """The cancel must not wait for a later turn of the event loop: by then the 499 is on
    /metrics and the batcher may have started the request (seen once in CI through
    asyncio.wrap_future, which passes a cancel on in a loop callback)."""

    class Left:
        async def receive(self):
            return {"type": "http.disconnect"}

    async def leave(future):
        with pytest.raises(app_lib.ClientGone):
            await app_lib._unless_disconnected(Left(), future)
        return future.cancelled()  # no await since: still the turn that raised

    assert asyncio.run(leave(concurrent.futures.Future()))


def test_a_client_that_leaves_costs_no_translation(runner):
    gated = Gated(runner)
    with serving(create_app(gated)) as url, concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = hold_the_runner(pool, url, gated)
        host, port = url.split("//")[1].rstrip("/").split(":")
        body = json.dumps({"texts": ["走了"]}).encode()
        with socket.create_connection((host, int(port))) as leaving:
            leaving.sendall(
                b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            wait_for_metric(url, "kformer_queue_requests 1.0")
        wait_for_metric(url, 'code="499"')  # the server saw it leave
        gated.gate.set()
        assert running.result()[0] == 200
        assert request(url + "v1/translate", {"texts": ["好"]})[0] == 200
    assert gated.calls == [["先"], ["好"]]  # "走了" never ran


def test_serve_command_finishes_requests_in_flight_on_sigterm(artifacts):
    process = subprocess.Popen(  # a server the test talks to, then stops with SIGTERM
        [*KFORMER, "serve", "--model", artifacts, "--port", "0", "--api-key", "k"]
        + ["--max-queue-chars", "1000000", "--max-chars", "1000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("loading") and "serving" in lines[1], lines
        url = re.search(r"http://\S+/", lines[1]).group()
        assert request(url + "health")[0] == 200
        assert request(url + "translate", {"q": "好", "source": "zh", "target": "en"})[2] == {
            "error": "Invalid API key"
        }
        key = {"Authorization": "Bearer k"}
        started = time.monotonic()
        assert request(url + "v1/translate", {"texts": ["他很高興。你呢？"] * 200}, headers=key)[0] == 200
        texts = int(200 * 4.0 / (time.monotonic() - started))  # about 4 s of work on this machine
        many = json.dumps({"texts": ["他很高興。你呢？"] * texts}, ensure_ascii=False).encode()
        host, port = url.split("//")[1].rstrip("/").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        connection.request("POST", "/v1/translate", many, key)  # all sent
        time.sleep(0.5)
        process.terminate()
        terminated = time.monotonic()
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert time.monotonic() > terminated + 0.1  # it was still being translated
        assert response.status == 200 and len(answer["translations"]) == texts
        assert process.wait(timeout=60) in (0, -15)
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url + "health", timeout=5)
    finally:
        process.kill()


def _only(artifacts, folder, formats):
    """A copy of the export `artifacts` whose manifest lists the files of `formats` only."""
    shutil.copytree(artifacts, folder, symlinks=True)
    manifest_edited(
        folder, lambda m: m.update(artifacts=[a for a in m["artifacts"] if a["format"] in formats])
    )
    return str(folder)


def test_serve_runs_a_runtime_the_export_has_and_names_its_pages(artifacts, tmp_path):
    """Without --runtime: onnx where the export has the variant, else tflite, else ctranslate2;
    the page's line names a URL for each of the page's runtimes the export has a file of."""
    from kformer.cli.serve import page_line
    from kformer.serve.server import default_runtime, load

    tflite_only = _only(artifacts, tmp_path / "tflite", ("tflite",))
    ctranslate2_only = _only(artifacts, tmp_path / "ct2", ("ctranslate2",))
    assert [default_runtime(artifacts, v) for v in ("fp32", "int8", "fixed-text")] == [
        "onnx",
        "onnx",
        "tflite",
    ]
    assert [default_runtime(tflite_only, "fp32"), default_runtime(ctranslate2_only, "int8")] == [
        "tflite",
        "ctranslate2",
    ]
    assert default_runtime(ctranslate2_only, "text") == "onnx"  # none has it: onnx says what is missing
    runner = load(tflite_only)  # translated its probe sentence
    assert (runner.fmt, runner.variant) == ("tflite", "fp32")
    url = "http://127.0.0.1:8000/"
    assert (
        page_line(url, artifacts)
        == f"{url}?runtime=onnx&variant=fp32 or {url}?runtime=litert&variant=fixed-text"
    )
    assert page_line(url, tflite_only) == f"{url}?runtime=litert&variant=fixed-text"
    assert page_line(url, ctranslate2_only).startswith("none (the export has no ONNX file")


def test_serve_command_errors_are_one_line(artifacts, tmp_path):
    partial = tmp_path / "no-int8"
    shutil.copytree(artifacts, partial, symlinks=True)
    manifest = json.loads((partial / "manifest.json").read_text())
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["variant"] not in ("int8", "int8-ort")]
    (partial / "manifest.json").write_text(json.dumps(manifest))
    with socket.socket() as taken:  # a port another program holds
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        (tmp_path / "empty").mkdir()
        for case, expected in [
            (["--model", str(tmp_path / "empty")], "manifest.json not found"),
            (["--model", artifacts, "--model", str(partial)], "translates zh-en, as --model"),
            (["--model", str(partial), "--variant", "int8"], "no onnx int8"),
            (["--model", artifacts, "--runtime", "keras"], "invalid choice"),
            (["--model", artifacts, "--max-chars", "0"], "--max-chars"),
            (["--model", artifacts, "--api-keys", str(tmp_path / "nokeys.txt")], "nokeys.txt"),
            (["--model", artifacts, "--runtime", "tflite", "--parallel", "2"], "runs one batch at a time"),
            (["--model", artifacts, "--port", port], "choose another --host or --port"),
            (
                ["--model", artifacts, "--port", "99999"],
                "argument --port: must be a finite int >= 0 and <= 65535",
            ),
            (["--model", artifacts, "--timeout-headers", "0"], "argument --timeout-headers"),
            (["--model", artifacts, "--cors-origins", "a.example"], "'a.example' is not an origin"),
        ]:
            # A case that loads after all serves until killed: fail it, do not hang.
            result = run_kformer("serve", *case, timeout=120)
            error = result.stderr.strip().splitlines()[-1]
            assert result.status == 2 and expected in error and "Traceback" not in result.stderr, (
                case,
                error,
            )


@pytest.mark.slow
def test_bench_serve_measures_levels_mixed_bodies_and_overload(artifacts, capsys):
    from kformer.bench.serve import CLIENT_LEVELS, bench_serve, print_serve_table

    results = bench_serve(  # the server with two batcher threads: the mixed check covers them too
        artifacts,
        sentences=20,
        rounds=1,
        seconds=0.5,
        requests=200,
        parallel=2,
        progress=lambda *a, **k: None,
    )
    assert set(results["levels"]) == set(CLIENT_LEVELS) and results["runner_batch32"] > 0
    assert results["parallel"] == 2
    assert all(
        row["sentences_per_s"] > 0 and row["errors"] == row["refused"] == 0
        for row in results["levels"].values()
    )
    mixed = results["mixed"]
    assert mixed["good_ok"] + mixed["bad_4xx"] == 200 and mixed["good_ok"] > 100 and mixed["bad_4xx"] > 10, (
        mixed
    )
    overload = results["overload"]
    assert overload["refused"] > 0 and overload["errors"] == 0 and overload["after_status"] == 200, overload
    print_serve_table(results)
    assert "x runner b32" in capsys.readouterr().out


@pytest.fixture(scope="module")
def two_pairs(model_dir, tokenizer, tmp_path_factory):
    """{direction: CTranslate2 runner} of two different random models, zh-en and en-zh."""
    from conftest import write_random_model

    from kformer.export.exporter import export

    en_zh = write_random_model(tmp_path_factory.mktemp("en_zh_model"), tokenizer, "en-zh", seed=4)
    runners = {}
    for direction, run in (("zh-en", model_dir), ("en-zh", en_zh)):
        out = str(tmp_path_factory.mktemp("pair") / direction)
        export(run, out, formats=("ctranslate2",), progress=lambda *a, **k: None)
        runners[direction] = open_runner(out, "ctranslate2")
    return runners


ENGLISH = ["Tom is here.", "Let us try it."]


def test_one_server_serves_every_pair_to_libretranslate_clients(two_pairs):
    from deep_translator import LibreTranslator
    from libretranslatepy import LibreTranslateAPI

    zh_en, en_zh = two_pairs["zh-en"], two_pairs["en-zh"]
    for texts in (TEXTS[:2], ENGLISH):  # two models, told apart by their outputs
        assert all(a != b for a, b in zip(zh_en.translate(texts), en_zh.translate(texts)))
    with serving(create_app([zh_en, en_zh])) as url:
        client = LibreTranslateAPI(url)
        assert client.languages() == [
            {"code": "zh", "name": "Chinese", "targets": ["en"]},
            {"code": "en", "name": "English", "targets": ["zh"]},
        ]
        assert client.translate(TEXTS[1], "zh", "en") == zh_en.translate([TEXTS[1]])[0]
        assert client.translate(ENGLISH[0], "en", "zh") == en_zh.translate([ENGLISH[0]])[0]
        assert client.translate(ENGLISH[1], "en", "zh-Hans") == en_zh.translate([ENGLISH[1]])[0]
        assert [d["language"] for d in client.detect(TEXTS[0])] == ["zh", "en"]
        assert [d["language"] for d in client.detect(ENGLISH[0])] == ["en", "zh"]
        for source, target, text, runner in (("zh", "en", TEXTS[0], zh_en), ("en", "zh", ENGLISH[1], en_zh)):
            translator = LibreTranslator(source=source, target=target, api_key="unused", custom_url=url)
            assert translator.translate(text) == runner.translate([text])[0]
        status, _, answer = request(url + "translate", {"q": ENGLISH[0], "source": "auto", "target": "zh"})
        assert answer["translatedText"] == en_zh.translate([ENGLISH[0]])[0]
        assert answer["detectedLanguage"]["language"] == "en"
        status, _, answer = request(url + "v1/translate", {"texts": ENGLISH, "source": "en", "target": "zh"})
        assert status == 200 and answer == {
            "translations": [t.to_dict() for t in en_zh.translations(ENGLISH)]
        }
        for body, field in (({"texts": ENGLISH}, "source"), ({"texts": ENGLISH, "source": "en"}, "target")):
            status, _, answer = request(url + "v1/translate", body)
            assert status == 400 and answer["field"] == field, answer
        status, _, answer = request(url + "translate", {"q": "x", "source": "fr", "target": "en"})
        assert status == 400 and answer["error"] == "fr is not supported"
        health = request(url + "health")[2]
        assert [m["direction"] for m in health["models"]] == ["zh-en", "en-zh"]


def test_each_model_has_its_batcher_and_its_memory_on_metrics(two_pairs, tmp_path, monkeypatch):
    from kformer.serve import server as server_lib
    from kformer.serve.server import export_folders, load_models

    assert server_lib._resident_bytes() > 0  # what the server reads of itself
    folders = [r.artifact_dir for r in two_pairs.values()]
    readings = iter([1000, 1500, 2000, 1900])  # resident bytes before and after each loading
    monkeypatch.setattr(server_lib, "_resident_bytes", lambda: next(readings))
    runners, sizes = load_models(folders, "ctranslate2")
    monkeypatch.undo()
    # what each model's loading added; none, not less, where pages were handed back meanwhile
    assert sizes == [500, 0]
    app = create_app(runners, resident_bytes=sizes)
    batchers = [m.batcher for m in app.state.service.models.values()]
    assert len(set(map(id, batchers))) == 2 and [b.runner for b in batchers] == runners
    with serving(app) as url:
        metrics = request(url + "metrics")[2]
    found = dict(re.findall(r'kformer_model_resident_bytes\{model="([a-z-]+)"\} ([0-9.e+]+)', metrics))
    assert {model: float(size) for model, size in found.items()} == {"zh-en": 500, "en-zh": 0}
    folder_of_exports = tmp_path / "models"
    folder_of_exports.mkdir()
    for folder in folders:
        os.symlink(folder, folder_of_exports / os.path.basename(folder))
    assert sorted(export_folders([str(folder_of_exports)])) == sorted(
        str(folder_of_exports / os.path.basename(f)) for f in folders
    )


PAGE = (
    "<!DOCTYPE html><html><head><title>我們試試看！</title><style>p { color: red }</style></head><body>"
    '<p class="note" title="Tom &amp; Mary &copy;" data-x="1">他很高興。<b>你呢？</b>&nbsp;好 <code>a &lt; b</code></p>'
    '<script>if (a < b) { go("他"); }</script><img src="x.png" alt="好"><!-- 好 --><pre>好\n</pre></body></html>'
)


def page_parts(page):
    """(tags with their attributes in order, contents of script/style/code/pre, text nodes)."""
    from bs4 import BeautifulSoup

    tree = BeautifulSoup(page, "html.parser")
    tags = [(tag.name, list(tag.attrs.items())) for tag in tree.find_all(True)]
    kept = [tag.decode_contents() for tag in tree.find_all(["script", "style", "code", "pre"])]
    return tags, kept


def test_web_pages_keep_their_markup_and_get_their_text_translated(runner, url):
    from kformer.serve import html

    status, _, answer = request(
        url + "translate", {"q": PAGE, "source": "zh", "target": "en", "format": "html"}
    )
    assert status == 200
    page = answer["translatedText"]
    assert page_parts(page) == page_parts(PAGE)
    assert 'title="Tom &amp; Mary &copy;"' in page and "&nbsp;" in page and "<!-- 好 -->" in page
    _, nodes = html.parse(PAGE)
    expected = runner.translate(html.texts(nodes))  # 我們試試看！, 他很高興。, 你呢？, 好
    _, found = html.parse(page)
    assert html.texts(found) == [e for e in expected if e.strip()]
    assert len(expected) == 4
    status, _, answer = request(url + "v1/translate", {"texts": [PAGE], "format": "html"})
    assert status == 200 and answer["translations"][0]["translation"] == page
    for broken in ("<p>好<b>嗎</p></i><", "<<<", "<p"):  # read as the parser reads it: a defined page
        status, _, answer = request(
            url + "translate", {"q": broken, "source": "zh", "target": "en", "format": "html"}
        )
        assert status == 200 and isinstance(answer["translatedText"], str), (broken, answer)


def test_marked_words_keep_their_place_in_a_sentence_translated_whole():
    """An element whose text runs through inline elements is translated whole; each marked word is
    wrapped again around its own translation where the whole's holds it (in order, whole words, its
    edge punctuation and case set aside); a plain mark not found is dropped, a link or a styled
    span not found has each text node translated alone, as other text nodes are."""
    from kformer.serve import html

    page = (
        '<p>他很<b>高興</b>。</p><p> 你<i>呢</i>？ </p><p><b>你</b>好<a href="x">你</a></p>'
        '<p>湯姆在<b>東京</b>。</p><p><b>我不</b>去。</p><p>我<a href="y">喜歡</a>茶</p>'
        '<div>好<br>嗎</div><ul><li><a href="x">首頁</a></li></ul><p>你<b>好<i>嗎</i></b></p>'
    )
    table = {
        "他很高興。": "He is very happy.", "他很": "he very", "高興": "happy", "。": ".",
        "你呢？": "And you?", "你": "you", "呢": "eh", "？": "?", "你好你": "you good you",
        "湯姆在東京。": "Tom is in Tokyo.", "湯姆在": "Tom at", "東京": "tokyo?",
        "我不去。": "I don't go.", "我不": "I don", "去。": "Go.",
        "我喜歡茶": "I like tea", "我": "I", "喜歡": "enjoy", "茶": "tea",
        "好": "good", "嗎": "?", "首頁": "Home", "好嗎": "OK?",
    }  # fmt: skip
    tree, pieces = html.parse(page)
    asked = html.texts(pieces)
    assert asked[:4] == ["他很高興。", "他很", "高興", "。"]  # the whole, then each text node
    assert asked.count("首頁") == 1  # a lone link is no sentence: translated once
    assert "你好嗎" not in asked and "好嗎" in asked  # the innermost element that runs inline
    assert html.rebuilt(tree, pieces, [table[t] for t in asked]) == (
        '<p>He is very <b>happy</b>.</p><p> And you? </p><p><b>you</b> good <a href="x">you</a></p>'
        '<p>Tom is in <b>Tokyo</b>.</p><p>I don\'t go.</p><p>I<a href="y">enjoy</a>tea</p>'
        '<div>good<br/>?</div><ul><li><a href="x">Home</a></li></ul><p>you<b>OK?</b></p>'
    )


def test_rate_limiter_counts_a_sliding_minute_per_client():
    from kformer.serve.limits import RateLimiter, TooManyRequests

    now = [1000.0]
    limiter = RateLimiter(clock=lambda: now[0])
    for _ in range(3):
        limiter.admit("a", 3)
        now[0] += 10
    with pytest.raises(TooManyRequests) as refused:
        limiter.admit("a", 3)
    assert refused.value.retry_after == 30  # the first request leaves the minute at 1060
    limiter.admit("b", 3)  # another client has its own count
    limiter.admit("a", None)  # no limit
    now[0] = 1060.5
    limiter.admit("a", 3)


def test_api_keys_file_gives_each_key_its_limit_and_names_bad_lines(tmp_path):
    from kformer.serve.limits import read_api_keys

    good = tmp_path / "keys.txt"
    good.write_text("# team keys\nalpha 120\nbeta   # the server's --req-limit\n\n")
    assert read_api_keys(str(good)) == {"alpha": 120, "beta": None}
    for text, where in (
        ("alpha 0\n", ":1:"),
        ("a 1\nb x\n", ":2:"),
        ("a\na\n", "listed twice"),
        ("\n", "no API keys"),
    ):
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(ValueError, match=where):
            read_api_keys(str(bad))


def test_per_client_limits_answer_429_and_413_and_the_server_stays_healthy(runner):
    settings = Settings(req_limit=2, api_keys={"alpha": 4, "beta": None, "pages": 9}, max_chars=20)
    body = {"q": "好", "source": "zh", "target": "en"}
    with serving(create_app(runner, settings)) as url:
        codes = [request(url + "translate", body)[0] for _ in range(3)]
        status, headers, answer = request(url + "translate", body)
        assert codes == [200, 200, 429] and status == 429 and int(headers["Retry-After"]) >= 1
        assert "limit is 2 per minute" in answer["error"]
        keyed = [request(url + "translate", {**body, "api_key": "alpha"})[0] for _ in range(5)]
        assert keyed == [200] * 4 + [429]  # the key's own limit, not the address's
        assert request(url + "translate", {**body, "api_key": "beta"})[0] == 200  # --req-limit, its own count
        assert request(url + "translate", {**body, "api_key": "gamma"})[0] == 403
        long = {**body, "q": "好" * 21, "api_key": "beta"}
        status, _, answer = request(url + "translate", long)
        assert status == 413 and "limit 20" in answer["error"]
        page = {
            **body,
            "q": "<p>" + "好" * 10 + "<b>" + "好" * 10 + "</b></p>",
            "format": "html",
            "api_key": "pages",
        }
        assert request(url + "translate", page)[0] == 200  # 20 characters, though asked whole and by node
        page["q"] = page["q"].replace("<b>", "<b>好好")
        status, _, answer = request(url + "translate", page)
        assert status == 413 and "22 characters, more than the limit 20" in answer["error"]
        assert request(url + "health")[0] == 200
        status, _, front = request(url + "frontend/settings")
        assert status == 200 and front["charLimit"] == 20 and front["apiKeys"] is True
        assert front["keyRequired"] is False and front["language"]["source"]["code"] == "zh"
