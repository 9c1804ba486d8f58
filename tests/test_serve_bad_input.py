"""`kformer serve` against hostile input: a request's failure stays its own, the work of a request
is bounded by what it is charged, and every malformed field is a 4xx; then a real `kformer serve`
on loopback under a bounded hostile client (docs/guide.md, "What bad input gets")."""

import concurrent.futures
import contextlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
from conftest import BEAM, KFORMER, MAX_LENGTH, manifest_edited
from test_serve import request

from kformer.decode.options import SearchOptions
from kformer.decode.text_batches import Hypothesis, Translation
from kformer.export.exporter import export
from kformer.export.formats import open_runner
from kformer.serve.app import create_app
from kformer.serve.batcher import Batcher
from kformer.serve.requests import BadRequest
from kformer.serve.server import serving
from kformer.serve.settings import Settings


@pytest.fixture(scope="module")
def export_dir(model_dir, tmp_path_factory):
    """The ONNX files of the random tiny model (what the server runs here)."""
    out = str(tmp_path_factory.mktemp("hostile") / "export")
    options = SearchOptions(beam_size=BEAM, max_length=MAX_LENGTH)
    export(model_dir, out, ("onnx",), (), options, progress=lambda *a, **k: None)
    return out


@pytest.fixture(scope="module")
def runner(export_dir):
    return open_runner(export_dir, "onnx")


@pytest.fixture(scope="module")
def url(runner):
    with serving(create_app(runner)) as url:
        yield url


class Tracebacks(logging.Handler):
    """Collects the log records that carry a traceback."""

    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        if record.exc_info:
            self.records.append(self.format(record))


@contextlib.contextmanager
def tracebacks_logged():
    """The tracebacks the app (logger kformer) and uvicorn (uvicorn.error) log in the block."""
    handler = Tracebacks()
    loggers = [logging.getLogger(name) for name in ("kformer", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def host_port(url):
    host, port = url.split("//")[1].rstrip("/").split(":")
    return host, int(port)


def metric(url, route, code):
    """The count of requests to `route` answered `code`, on /metrics."""
    found = re.search(
        rf'kformer_requests_total\{{code="{code}",route="{route}"\}} ([0-9.]+)', request(url + "metrics")[2]
    )
    return float(found.group(1)) if found else 0.0


class Echo:
    """A runner without a model: each text's translation is the text reversed; a text with a lone surrogate
    (U+D800, which no tokenizer encodes) fails the call it is in, as SentencePiece's
    encoder does. Records the texts of each call."""

    parallel = 1

    def __init__(self):
        self.calls = []

    def translations(self, texts, options=None):
        self.calls.append(list(texts))
        if any("\ud800" in text for text in texts):
            raise TypeError("Sequence elements must be str or bytes")
        return [Translation(t[::-1], -1.0, (Hypothesis(t[::-1], -1.0),)) for t in texts]


def test_a_request_that_fails_in_a_batch_fails_alone():
    """One request whose text the runner cannot encode gets its own 400; the requests batched with
    it get their translations."""
    runner = Echo()
    batcher = Batcher(runner, batch_size=64, window=0.2, max_queue_chars=10**6)
    try:
        texts = [[f"text {i}"] for i in range(30)]
        texts.insert(7, ["bad \ud800"])
        futures = [batcher.submit(t, None) for t in texts]
        concurrent.futures.wait(futures, timeout=30)
    finally:
        batcher.close()
    assert len(runner.calls[0]) == 31  # they did run together
    for submitted, future in zip(texts, futures):
        if submitted == ["bad \ud800"]:
            assert isinstance(future.exception(), BadRequest) and future.exception().status == 400
        else:
            assert [t.text for t in future.result()] == [submitted[0][::-1]]


DEEP = b"[" * 100_000 + b"]" * 100_000
LT = b'"source": "zh", "target": "en"'


@pytest.mark.parametrize(
    "route, body, field, words",
    [
        ("translate", b'{"q": ' + DEEP + b", " + LT + b"}", None, "nested"),
        ("v1/translate", b'{"texts": ["x"], "alpha": ' + DEEP + b"}", None, "nested"),
        ("translate", b'{"q": "x", "alternatives": 1e999, ' + LT + b"}", "alternatives", "whole number"),
        ("translate", b'{"q": "x", "alternatives": true, ' + LT + b"}", "alternatives", "got true"),
        ("translate", b'{"q": "x", "alternatives": -1e400, ' + LT + b"}", "alternatives", "whole number"),
        ("v1/translate", b'{"texts": ["x"], "no_repeat_ngram": 1e10}', "no_repeat_ngram", "whole number"),
        (
            "v1/translate",
            b'{"texts": ["x"], "no_repeat_ngram": 10000000000}',
            "no_repeat_ngram",
            "2147483647",
        ),
        ("v1/translate", b'{"texts": ["x"], "max_length": 1e999}', "max_length", "max length"),
        ("v1/translate", b'{"texts": ["x"], "alpha": 1e999}', "alpha", "alpha"),
        ("v1/translate", b'{"texts": ["x"], "nbest": 99999999999999999999}', "nbest", "nbest"),
        ("translate", b'{"q": "\\ud800", ' + LT + b"}", "q", "lone surrogate"),
        ("translate", b'{"q": ["a", "\\udfffb"], ' + LT + b"}", "q", "lone surrogate"),
        ("translate", b'{"q": "x", "source": "\\ud800", "target": "en"}', "source", "lone surrogate"),
        ("v1/translate", b'{"texts": ["x \\ud800"]}', "texts", "lone surrogate"),
        ("v1/translate", b'{"texts": ["x"], "\\ud800": 1}', None, "lone surrogate"),
        ("detect", b'{"q": "\\ud800"}', "q", "lone surrogate"),
        ("v1/translate", b'{"texts": ["<p>a</p>"], "format": "html", "nbest": "x"}', "nbest", "nbest"),
        ("v1/translate", b'{"texts": ["<p>a</p>"], "format": "html", "alpha": 1e999}', "alpha", "alpha"),
    ],
)
def test_every_malformed_field_is_a_400_without_a_traceback(url, route, body, field, words):
    with tracebacks_logged() as logged:
        status, _, answer = request(url + route, body)
    assert status == 400 and words in answer["error"], answer
    assert route != "v1/translate" or answer.get("field") == field, answer
    assert logged == []


def test_a_request_with_a_text_no_tokenizer_encodes_fails_alone(url, runner):
    """Innocent requests sent with one that holds a lone surrogate, at once: all answered."""
    bad = b'{"q": "\\ud800", ' + LT + b"}"
    texts = [f"{i}。好" for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(13) as pool:
        sent = [
            pool.submit(request, url + "translate", {"q": t, "source": "zh", "target": "en"}) for t in texts
        ]
        refused = pool.submit(request, url + "translate", bad)
        answers = [f.result() for f in sent]
    assert refused.result()[0] == 400
    assert [a[2]["translatedText"] for a in answers] == runner.translate(texts)


def test_a_client_that_leaves_mid_body_is_a_499_not_a_500(url):
    before = metric(url, "/v1/translate", 499)
    with tracebacks_logged() as logged:
        with socket.create_connection(host_port(url)) as leaving:
            leaving.sendall(
                b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"texts": ["'
            )
            time.sleep(0.2)
        deadline = time.monotonic() + 30
        while metric(url, "/v1/translate", 499) == before and time.monotonic() < deadline:
            time.sleep(0.05)
    assert metric(url, "/v1/translate", 499) == before + 1
    assert metric(url, "/v1/translate", 500) == 0 and logged == []


def test_a_request_is_charged_for_its_sentences_not_only_its_characters(url, runner):
    """Each text and each sentence counts at least SENTENCE_FLOOR characters against --max-chars:
    2,000 one-character texts, or one text of 2,000 one-character sentences, cost many times what
    one text of 2,000 characters does, and are refused; that one text is not, nor a paragraph."""
    lt = {"source": "zh", "target": "en"}
    for q in (["好"] * 2000, "好。" * 2000):
        status, _, answer = request(url + "translate", {"q": q, **lt})
        assert status == 413 and "more than the limit 10,000" in answer["error"], answer
    status, _, answer = request(url + "v1/translate", {"texts": ["好"] * 2000})
    assert status == 413
    assert request(url + "translate", {"q": "好" * 2000, **lt})[0] == 200
    paragraph = "我們試試看！他很高興。你呢？" * 100
    status, _, answer = request(url + "translate", {"q": paragraph, **lt})
    assert status == 200 and answer["translatedText"] == runner.translate([paragraph])[0]

    from kformer.serve.cost import SENTENCE_FLOOR, request_cost

    assert request_cost(["好"] * 3, 10**6) == 3 * SENTENCE_FLOOR
    six_and_five = "我們試試看！他很高興。"  # two sentences, of 6 and 5 characters
    assert request_cost(["", six_and_five], 10**6) == SENTENCE_FLOOR + 11 + (10 - 6) + (10 - 5)
    assert request_cost(["a" * 100] * 10**6, 1000) <= 1100  # counted no further than the limit


HOSTILE_PAGES = {  # pages that made a parser, or the walk over its tree, quadratic
    "unclosed comments": lambda n: "<!--" * n,
    "unclosed attributes": lambda n: "<a b='" * n,
    "unclosed tags": lambda n: "<a " * n,
    "nested marks": lambda n: "<b>好" * n,
    "marks in one sentence": lambda n: "<p>" + "好<b>好</b>" * n + "</p>",
    "text nodes side by side": lambda n: "<div>" + "好<br>" * n + "</div>",
    "links not found": lambda n: "<p>" + '好<a href="x">嗎</a>' * n + "</p>",
}


@pytest.mark.parametrize("name", HOSTILE_PAGES)
def test_a_page_takes_time_linear_in_its_size(name):
    """Parsing, charging and rebuilding a page: four times the page, at most twice four times the
    time (a quadratic step takes sixteen). This thread's CPU time, the best of three: what other
    processes on the machine do does not count."""
    from kformer.serve import html

    def seconds(n):
        best = float("inf")
        for _ in range(3):
            start = time.thread_time()
            tree, pieces = html.parse(HOSTILE_PAGES[name](n))
            html.charged(pieces)
            html.rebuilt(tree, pieces, html.texts(pieces))  # each text its own translation
            best = min(best, time.thread_time() - start)
        return best

    small, large = seconds(1500), seconds(6000)
    assert large < 8 * small + 0.05, (small, large)


@pytest.mark.parametrize(
    "page",
    ["<p>a<![ b", "<p>好<b>嗎</p></i><", "<<<", "<p", "<![CDATA[好]]>", "<?xml?><p>好</p>", "&#0;&#xD800;好"],
)
def test_a_malformed_page_gets_a_defined_result(url, page):
    status, _, answer = request(
        url + "translate", {"q": page, "source": "zh", "target": "en", "format": "html"}
    )
    assert status == 200 and isinstance(answer["translatedText"], str), answer


def test_the_server_answers_while_it_reads_the_worst_page(url):
    """A page is read off the event loop: /health answers within a second meanwhile; a page too
    long to be read is refused before it is."""
    lt = {"source": "zh", "target": "en", "format": "html"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sent = pool.submit(request, url + "translate", {"q": "<b>好" * 10_000, **lt})
        while not sent.done():
            start = time.monotonic()
            assert request(url + "health")[0] == 200
            assert time.monotonic() - start < 1.0
        status, _, answer = sent.result()
    assert status == 413 and "more than the limit" in answer["error"]
    start = time.monotonic()
    status, _, answer = request(url + "translate", {"q": "<!--" * 60_000, **lt})
    assert status == 413 and "before they are read" in answer["error"] and time.monotonic() - start < 1.0


def test_pages_waiting_to_be_read_are_bounded_as_the_queue_is(runner):
    """While the page thread is busy, pages wait for it up to the queue's bound in markup
    (html.MARKUP_ALLOWANCE times --max-queue-chars); past it a page request gets 503."""
    from kformer.serve import html

    settings = Settings(max_queue_chars=1000)
    app = create_app(runner, settings)
    markup = "a" * (html.MARKUP_ALLOWANCE * 1000 * 3 // 4)  # two pages of it are over the bound
    page = {"q": f'<p title="{markup}">好</p>', "source": "zh", "target": "en", "format": "html"}
    busy = threading.Event()
    app.state.service.page_thread.submit(busy.wait, 60)
    with serving(app) as url, concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(request, url + "translate", page)
        time.sleep(0.5)
        status, headers, _ = request(url + "translate", page)
        assert status == 503 and headers["Retry-After"], status
        busy.set()
        assert waiting.result()[0] == 200
        assert request(url + "translate", page)[0] == 200  # the thread is free again


def closed_after(connection, limit):
    """Seconds until the server closes `connection` (reading what it sends), at most `limit`."""
    start, answer = time.monotonic(), b""
    connection.settimeout(limit)
    try:
        while chunk := connection.recv(4096):
            answer += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return time.monotonic() - start, answer


def test_slow_and_idle_connections_are_closed_in_their_time(runner):
    """A connection that sends nothing, or its headers a byte at a time, is closed once its
    headers are --timeout-headers late; a body that trickles gets a 408 at --timeout-body; an idle
    kept-alive connection closes at --timeout-keep-alive (uvicorn's)."""
    settings = Settings(timeout_headers=1.0, timeout_body=1.0, timeout_keep_alive=1.0)
    with serving(create_app(runner, settings)) as url:
        silent = socket.create_connection(host_port(url))
        seconds, answer = closed_after(silent, 10)
        assert 0.9 < seconds < 4 and (answer == b"" or answer.startswith(b"HTTP/1.1 408 ")), answer
        slow = socket.create_connection(host_port(url))
        start = time.monotonic()
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\n":
            try:
                slow.sendall(bytes([byte]))
            except OSError:  # closed by the server
                break
            time.sleep(0.2)
        assert time.monotonic() - start < 4
        trickle = socket.create_connection(host_port(url))
        trickle.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        seconds, answer = closed_after(trickle, 10)
        assert seconds < 4 and answer.startswith(b"HTTP/1.1 408 "), answer
        early = socket.create_connection(host_port(url))  # answered 413 on its length: one answer
        early.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Length: 9999999\r\n\r\n{")
        seconds, answer = closed_after(early, 10)
        assert answer.startswith(b"HTTP/1.1 413 ") and answer.count(b"HTTP/1.1 ") == 1, answer
        kept = socket.create_connection(host_port(url))
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        seconds, answer = closed_after(kept, 10)
        assert 0.9 < seconds < 4 and answer.startswith(b"HTTP/1.1 200 "), answer
        assert request(url + "health")[0] == 200
        metrics = request(url + "metrics")[2]
    assert 'code="408",route="/v1/translate"' in metrics and 'code="499"' not in metrics


def test_the_connection_cap_is_the_operators(runner):
    """Past --limit-concurrency connections, requests get 503 at once; once the idle ones are
    closed (--timeout-headers), the server answers again."""
    settings = Settings(limit_concurrency=4, timeout_headers=1.0)
    with serving(create_app(runner, settings)) as url:
        idle = [socket.create_connection(host_port(url)) for _ in range(4)]
        assert request(url + "health")[0] == 503
        time.sleep(1.5)
        assert request(url + "health")[0] == 200
        for connection in idle:
            connection.close()


def test_cors_origins_are_the_operators(runner):
    """Any site's page may call the API by default (LibreTranslate's servers allow it); with
    --cors-origins, only those sites' pages."""
    origin = {"Origin": "https://a.example"}
    with serving(create_app(runner)) as url:
        _, headers, _ = request(url + "languages", headers=origin)
        assert headers["access-control-allow-origin"] == "*"
    with serving(create_app(runner, Settings(cors_origins=("https://a.example",)))) as url:
        _, headers, _ = request(url + "languages", headers=origin)
        assert headers["access-control-allow-origin"] == "https://a.example"
        _, headers, _ = request(url + "languages", headers={"Origin": "https://b.example"})
        assert "access-control-allow-origin" not in headers
    with serving(create_app(runner, Settings(cors_origins=()))) as url:
        _, headers, _ = request(url + "languages", headers=origin)
        assert "access-control-allow-origin" not in headers


def raw_request(url, head, body=b""):
    """(status, body) of a request written by hand (`head`: its line and headers, as bytes)."""
    with socket.create_connection(host_port(url)) as connection:
        connection.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        _, answer = closed_after(connection, 30)
    status, _, rest = answer.partition(b"\r\n")
    return int(status.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("key, sent", [("ключ", "utf-8"), ("clé", "utf-8"), ("clé", "latin-1")])
def test_a_key_that_is_not_ascii_works_as_a_bearer_header(runner, key, sent):
    body = b'{"q": "\xe5\xa5\xbd", "source": "zh", "target": "en"}'
    with serving(create_app(runner, Settings(api_key=key))) as url:
        head = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        bearer = b"Authorization: Bearer " + key.encode(sent) + b"\r\n"
        assert raw_request(url, head + bearer, body)[0] == 200
        assert raw_request(url, head + b"Authorization: Bearer other\r\n", body)[0] == 403
        form = f"q=%E5%A5%BD&source=zh&target=en&api_key={urllib.parse.quote(key)}".encode()
        assert request(url + "translate", form, "application/x-www-form-urlencoded")[0] == 200


def onnx_files(manifest):
    return next(a for a in manifest["artifacts"] if a["format"] == "onnx")["files"]


def test_a_manifest_names_files_inside_its_folder_only(export_dir, tmp_path):
    """An absolute path, a path out through "..", or a symlink out of the folder is refused
    (whatever its sha256), naming the entry."""
    from kformer.contracts.export import ArtifactError

    outside = tmp_path / "outside"
    shutil.copytree(export_dir, outside)
    cases = {
        "absolute": lambda m: m["tokenizer"].update(file=str(outside / "tokenizer.model")),
        "dot-dot": lambda m: onnx_files(m)["greedy"].update(file="../outside/onnx/fp32/greedy.onnx"),
        "dot-dot inside": lambda m: m["tokenizer"].update(file="onnx/../../outside/tokenizer.model"),
    }
    for name, edit in cases.items():
        folder = tmp_path / name
        shutil.copytree(export_dir, folder)
        manifest_edited(folder, edit)
        with pytest.raises(ArtifactError, match="not a path inside the export folder"):
            open_runner(str(folder), "onnx", options=SearchOptions(beam_size=1))
    linked = tmp_path / "linked"
    shutil.copytree(export_dir, linked)
    os.remove(linked / "tokenizer.model")
    os.symlink(outside / "tokenizer.model", linked / "tokenizer.model")
    with pytest.raises(ArtifactError, match="outside the export folder"):
        open_runner(str(linked), "onnx")


def test_the_server_serves_an_exports_listed_files_and_no_path_of_the_machine(export_dir, tmp_path):
    """/model/ serves manifest.json (without the machine's paths: the training folder, the
    corpus) and the files it lists; other files in the folder are not served."""
    from kformer.export import page

    if not all(os.path.isdir(folder) for folder in page.ROUTES.values()):
        pytest.skip("the page's JavaScript packages are not installed (npm ci --prefix export/web)")
    folder = tmp_path / "export"
    shutil.copytree(export_dir, folder)
    (folder / "secret.txt").write_text("not for the web")
    (folder / "onnx" / "notes.txt").write_text("nor this")
    with serving(create_app(open_runner(str(folder), "onnx"))) as url:
        for prefix in ("model/", "models/zh-en/"):
            status, _, manifest = request(url + prefix + "manifest.json")
            assert status == 200 and manifest["artifacts"] and manifest["tokenizer"]
            shown = json.dumps(manifest)
            assert str(tmp_path) not in shown and export_dir not in shown and '"/' not in shown, shown
            for entry in [manifest["tokenizer"], *onnx_files(manifest).values()]:
                with urllib.request.urlopen(url + prefix + entry["file"]) as response:
                    assert response.read() == (folder / entry["file"]).read_bytes()
            for hidden in (
                "secret.txt",
                "onnx/notes.txt",
                "onnx",
                "../export/secret.txt",
                "%2e%2e/secret.txt",
            ):
                assert request(url + prefix + hidden)[0] == 404, hidden


def test_a_listed_folder_that_links_out_of_the_export_is_not_served(export_dir, tmp_path):
    """A listed folder replaced by a link to one outside the export folder (once its runner is
    open): neither the files listed in it nor what else the outside folder holds are served."""
    from kformer.export import page

    if not all(os.path.isdir(folder) for folder in page.ROUTES.values()):
        pytest.skip("the page's JavaScript packages are not installed (npm ci --prefix export/web)")
    folder = tmp_path / "export"
    shutil.copytree(export_dir, folder)
    runner = open_runner(str(folder), "onnx")
    listed = json.loads((folder / "manifest.json").read_text())["artifacts"][0]["file"]
    outside = tmp_path / "outside"
    shutil.move(folder / listed, outside)
    (outside / "key.txt").write_text("not for the web")
    os.symlink(outside, folder / listed)
    with serving(create_app(runner)) as url:
        for name in ["key.txt", *os.listdir(outside)]:
            assert request(f"{url}model/{listed}/{name}")[0] == 404, name
        assert request(url + "model/manifest.json")[0] == 200


def resident_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) / 1024


def timed(send, *args, **kwargs):
    """(seconds, send's result)."""
    start = time.monotonic()
    result = send(*args, **kwargs)
    return time.monotonic() - start, result


PAIR = {"source": "zh", "target": "en"}
INNOCENT = [f"{i}。他很高興。" for i in range(30)]


def burst(url):
    """One round of hostile requests against a server (run with 2 s deadlines); each check's
    figures, for the test's report."""
    seen = {}
    with concurrent.futures.ThreadPoolExecutor(31) as pool:  # the surrogate batch
        innocent = [pool.submit(request, url + "translate", {"q": q, **PAIR}) for q in INNOCENT]
        bad = pool.submit(request, url + "translate", b'{"q": "\\ud800 x", "source": "zh", "target": "en"}')
        seen["innocent"] = sorted({f.result()[0] for f in innocent})
        seen["surrogate"] = bad.result()[0]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # /health while the worst pages are read
        seen["health_s"] = 0.0
        for page in ("<b>好" * 10_000, "<!--" * 30_000, "<a " * 60_000):
            sent = pool.submit(request, url + "translate", {"q": page, "format": "html", **PAIR})
            while not sent.done():
                seconds, (status, _, _) = timed(request, url + "health")
                assert status == 200
                seen["health_s"] = max(seen["health_s"], seconds)
            seen.setdefault("pages", []).append(sent.result()[0])
    seen["deep_and_absurd"] = [
        request(url + route, body)[0]
        for route, body in (
            ("translate", b'{"q": ' + DEEP + b', "source": "zh", "target": "en"}'),
            ("translate", b'{"q": "x", "alternatives": 1e999, "source": "zh", "target": "en"}'),
            ("v1/translate", b'{"texts": ["x"], "no_repeat_ngram": 10000000000}'),
            ("translate", b'{"q": "x", "alternatives": true, "source": "zh", "target": "en"}'),
        )
    ]
    idle = socket.create_connection(host_port(url))
    seen["idle_closed_s"], _ = closed_after(idle, 30)
    seen["tiny_s"], (seen["tiny"], _, _) = timed(request, url + "translate", {"q": ["好"] * 5000, **PAIR})
    seen["one_text_s"], (seen["one_text"], _, _) = timed(
        request, url + "translate", {"q": "好" * 5000, **PAIR}
    )
    return seen


def test_a_hostile_client_cannot_take_down_a_real_server(export_dir, tmp_path):
    """`kformer serve` on loopback with 2 s deadlines, four rounds of `burst`: the innocent
    requests batched with a lone surrogate are answered; /health answers within a second while the
    worst pages are read; deep JSON and absurd numbers get 400; an idle connection is closed at its
    deadline; 5,000 one-character texts are refused, sooner than one text of 5,000 characters is
    translated. Then the server is healthy, has logged no traceback, and its memory is within 20% of
    what it was after the first round (which loads what the server keeps: the files of both
    searches, the runtime's buffers for the largest batch)."""
    log = tmp_path / "server.log"
    deadlines = ["--timeout-headers", "2", "--timeout-body", "2", "--timeout-keep-alive", "2"]
    with open(log, "w") as stderr:
        server = subprocess.Popen(
            [*KFORMER, "serve", "--model", export_dir, "--port", "0", *deadlines],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        lines = [server.stdout.readline() for _ in range(2)]
        url = re.search(r"http://\S+/", lines[1]).group()
        fresh = resident_mb(server.pid)  # reported: the first round adds what the server keeps
        rounds = [burst(url)]  # every path once: what it loads and keeps is there before the measure
        before = resident_mb(server.pid)
        rounds += [burst(url) for _ in range(3)]
        after = resident_mb(server.pid)
        assert request(url + "health")[0] == 200
        assert request(url + "translate", {"q": INNOCENT[:4], **PAIR})[0] == 200
        metrics = request(url + "metrics")[2]
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(
        f"\nhostile client: fresh {fresh:.0f} MB, before {before:.0f} MB, after {after:.0f} MB; rounds {rounds}"
    )
    for seen in rounds:
        assert seen["innocent"] == [200] and seen["surrogate"] == 400, seen
        assert seen["health_s"] < 1.0 and seen["pages"] == [413, 200, 200], seen
        assert seen["deep_and_absurd"] == [400] * 4, seen
        assert 1.9 < seen["idle_closed_s"] < 5, seen
        assert seen["tiny"] == 413 and seen["one_text"] == 200 and seen["tiny_s"] < seen["one_text_s"] + 1, (
            seen
        )
    assert after < 1.2 * before, (before, after)
    assert 'code="500"' not in metrics and "Traceback" not in log.read_text(), log.read_text()[-3000:]


def test_many_empty_pages_are_refused_before_they_are_read(url):
    """A page is a text: each counts at least SENTENCE_FLOOR characters, checked before any is read."""
    start = time.monotonic()
    status, _, answer = request(url + "v1/translate", {"texts": [""] * 5000, "format": "html"})
    assert status == 413 and "before they are read" in answer["error"] and time.monotonic() - start < 1.0
    assert request(url + "v1/translate", {"texts": [""] * 3, "format": "html"})[0] == 200


def test_the_language_of_a_long_text_is_judged_by_its_first_characters(url):
    """/detect (and source "auto") read a text's first SAMPLE_CHARACTERS: a megabyte of them held
    the event loop, and every other request with it."""
    from kformer.serve.detect import SAMPLE_CHARACTERS

    status, _, answer = request(url + "detect", {"q": "a" * SAMPLE_CHARACTERS + "好" * 1000})
    assert status == 200 and answer == [{"language": "zh", "confidence": 0.0}], answer  # zh alone is served
