"""What a request is charged against `--max-chars` (413 above it) and the queue's bound (503): its
characters, where every sentence, and every text, counts at least SENTENCE_FLOOR characters.

A translation's work grows with its sentences more than with its characters: each sentence is a
row of a batch with search steps of its own, however short it is, so many one-character texts
(or sentences: "好。好。好。...") cost many times what one text of as many characters does.
Charged this way, the largest request the limit lets in costs about what the largest of running
text does, whatever its shape. Sentences are cut as the runners cut them
(kformer.decode.text_batches: lines, then kformer.decode.sentences)."""

from kformer.decode.sentences import WHITESPACE, split_sentences

# About what a sentence's row of a batch and its search steps cost, in characters of running text.
SENTENCE_FLOOR = 10


def text_cost(text):
    """The characters a text is charged: its own, and what each sentence shorter than
    SENTENCE_FLOOR lacks of it; at least SENTENCE_FLOOR (an empty text is still answered)."""
    sentences = (s for line in text.strip(WHITESPACE).split("\n") for s in split_sentences(line))
    shortfall = sum(SENTENCE_FLOOR - len(s) for s in sentences if len(s) < SENTENCE_FLOOR)
    return max(SENTENCE_FLOOR, len(text) + shortfall)


def request_cost(texts, limit):
    """What `texts` are charged, counted no further than past `limit` (a request of a million
    empty texts is refused without looking at them all): a number over `limit` is over it."""
    total = 0
    for text in texts:
        if total > limit:
            break
        total += text_cost(text) if len(text) <= limit else len(text)
    return total
