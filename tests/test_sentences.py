"""Sentence and clause splitting (kformer/decode/sentences.py), and the page's copy of it
(export/web/sentences.js, run by Node) giving the same splits."""

import json
import os

import pytest
from conftest import need, output
from test_web import NODE, split_sentences

from kformer.decode import sentences
from kformer.export import page

CASES = {
    "我們試試看！他很高興。你呢？": ["我們試試看！", "他很高興。", "你呢？"],
    "他说：“我不去。”然后走了。": ["他说：“我不去。”", "然后走了。"],
    "「你呢？」好": ["「你呢？」", "好"],
    "你好!我是汤姆。": ["你好!", "我是汤姆。"],
    'Mr. Smith went to Washington. He said "Hi!" Then he left... OK?': [
        "Mr. Smith went to Washington.",
        'He said "Hi!"',
        "Then he left...",
        "OK?",
    ],
    "It costs 3.14 dollars. J. Smith agreed, e.g. this works.": [
        "It costs 3.14 dollars.",
        "J. Smith agreed, e.g. this works.",
    ],
    "Wait... what?! Yes.": ["Wait... what?!", "Yes."],
    "  no end here  ": ["no end here"],
    "   ": [],
    "": [],
    "Tom (the cat) sleeps. (Really.) Yes": ["Tom (the cat) sleeps.", "(Really.)", "Yes"],
}


@pytest.mark.parametrize("text", CASES)
def test_sentences_split_where_they_end(text):
    assert sentences.split_sentences(text) == CASES[text]


def test_clauses_split_after_their_marks_and_keep_every_character():
    sentence = "他很高兴，因为朋友们都来了；我们也来了, and then, 1,000 people: yes 12:30"
    clauses = sentences.split_clauses(sentence)
    assert clauses == [
        "他很高兴，",
        "因为朋友们都来了；",
        "我们也来了, ",
        "and then, ",
        "1,000 people: ",
        "yes 12:30",
    ]
    assert "".join(clauses) == sentence
    assert sentences.split_clauses("没有标点") == ["没有标点"]


def test_joiner_follows_the_target_script():
    assert sentences.joiner("zh") == "" and sentences.joiner("en") == " " and sentences.joiner(None) == " "


def test_the_page_splits_as_python_does(tmp_path):
    """Every test-split sentence of both languages, and those sentences run together five at a
    time (paragraphs), split identically by export/web/sentences.js in Node."""
    need(NODE, "node not found: the page's sentence splitting is checked with Node")
    pairs = split_sentences()
    texts = [text for pair in pairs for text in pair] + list(CASES)
    texts += ["".join(p[0] for p in pairs[i : i + 5]) for i in range(0, 500, 5)]
    texts += [" ".join(p[1] for p in pairs[i : i + 5]) for i in range(0, 500, 5)]
    job = tmp_path / "texts.json"
    job.write_text(json.dumps(texts), encoding="utf-8")
    script = (
        "import { readFileSync } from 'node:fs';"
        f"import {{ splitSentences, splitClauses }} from {json.dumps(os.path.join(page.WEB_DIR, 'sentences.js'))};"
        "const texts = JSON.parse(readFileSync(process.argv[1], 'utf8'));"
        "console.log(JSON.stringify(texts.map((t) => [splitSentences(t), splitClauses(t)])));"
    )
    found = output([NODE, "--input-type=module", "-e", script, str(job)])
    expected = [[sentences.split_sentences(t), sentences.split_clauses(t)] for t in texts]
    got = json.loads(found)
    assert [t for t, a, b in zip(texts, expected, got) if a != b] == []
    assert sum(len(s) == 5 for s, _ in expected[-200:-100]) > 80  # the Chinese paragraphs split into five
