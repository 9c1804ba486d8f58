"""format=html: a web page's text translated with its markup kept (BeautifulSoup on Python's
html.parser, which reads any page, malformed ones included, into a tree).

The page's text outside SKIPPED elements is cut into pieces, each translated in context:
- a sentence with marked words, an element of text and INLINE elements (`<p>湯姆在<b>東京</b>工作。</p>`),
  is translated whole; each marked element's own translation, where the whole's holds it (in
  order, whole words, edge punctuation and case set aside), is marked again ("Tom works in
  <b>Tokyo</b>."), as Argos Translate's tag injection does. A plain mark not found is dropped (its
  words are in the whole: a sentence model translates a fragment alone badly); a link or a styled
  span not found cannot be, so that element's text nodes are each translated alone;
- any other text node is translated on its own, its leading and trailing whitespace kept.
Tags, attributes, comments, SKIPPED elements' contents and entities come out as they went in
(entities written by name: &nbsp; stays &nbsp;); a tag left open is closed where the parser
closes it, the one defined result for a malformed page."""

import unicodedata

from bs4 import BeautifulSoup, Comment, Declaration, Doctype, NavigableString, ProcessingInstruction, Tag
from bs4.formatter import HTMLFormatter

from kformer.serve import cost

SKIPPED = frozenset(
    {"script", "style", "code", "pre", "kbd", "samp", "var", "textarea", "noscript", "template"}
)
# Elements that mark words inside a sentence, not a sentence of their own.
INLINE = frozenset("a abbr b cite dfn em i mark q s small span strong sub sup u".split())
NOT_TEXT = (Comment, Declaration, Doctype, ProcessingInstruction)
# What a translation's edges may carry that the whole's may not at that place: punctuation, spaces.
EDGES = "".join(chr(c) for c in range(0x10000) if unicodedata.category(chr(c))[0] in "PZ" or chr(c).isspace())


class _AsWritten(HTMLFormatter):
    """Named entities where the character has one, attributes in the page's order."""

    def __init__(self):
        super().__init__(entity_substitution=HTMLFormatter.REGISTRY["html"].entity_substitution)

    def attributes(self, tag):
        return list(tag.attrs.items())


def _is_text(child):
    return isinstance(child, NavigableString) and not isinstance(child, NOT_TEXT)


def _is_marked_words(child):
    """An inline element holding one text and nothing else: `<b>高興</b>`."""
    return (
        isinstance(child, Tag)
        and child.name in INLINE
        and len(child.contents) == 1
        and _is_text(child.contents[0])
        and child.contents[0].strip() != ""
    )


def _runs_inline(tag):
    """True where the tag holds texts and marked words only, and both: words of its own around
    marked ones (a link alone in a list item is not a sentence with marked words)."""
    children = tag.contents if isinstance(tag, Tag) and not isinstance(tag, BeautifulSoup) else []
    return (
        any(map(_is_marked_words, children))
        and any(_is_text(c) and c.strip() for c in children)
        and all(_is_text(c) or _is_marked_words(c) for c in children)
    )


def _block(node):
    """The element whose text runs inline through `node`, or None."""
    for holder in (node.parent, node.parent.parent if _is_marked_words(node.parent) else None):
        if holder is not None and _runs_inline(holder):
            return holder
    return None


def parse(page):
    """(the page's tree, its pieces to translate, in order: text nodes, and elements whose text
    runs through inline elements)."""
    tree = BeautifulSoup(page, "html.parser")
    pieces = []
    for node in tree.find_all(string=True):
        if isinstance(node, NOT_TEXT) or not node.strip():
            continue
        if any(parent.name in SKIPPED for parent in node.parents):
            continue
        piece = _block(node) or node
        if not pieces or pieces[-1] is not piece:
            pieces.append(piece)
    return tree, pieces


def _nodes(block):
    """The text nodes with text of an element that runs inline, in order."""
    return [n for n in block.find_all(string=True) if n.strip()]


def texts(pieces):
    """What to translate, in order: a text node's text without its surrounding whitespace; an
    element's whole text, then each of its text nodes' (the fallback)."""
    found = []
    for piece in pieces:
        if isinstance(piece, Tag):
            found += [piece.get_text().strip(), *(n.strip() for n in _nodes(piece))]
        else:
            found.append(piece.strip())
    return found


def charged(pieces):
    """What the pieces' texts are charged against a request's limit (kformer.serve.cost): each
    piece's text once, though `texts` asks a sentence with marked words twice (whole and node by
    node), and what each of those nodes, a row of its own, lacks of a sentence's floor."""
    total = 0
    for piece in pieces:
        if isinstance(piece, Tag):
            total += cost.text_cost(piece.get_text().strip())
            total += sum(max(0, cost.SENTENCE_FLOOR - len(node.strip())) for node in _nodes(piece))
        else:
            total += cost.text_cost(piece.strip())
    return total


def rebuilt(tree, pieces, translations):
    """The page with each piece's text replaced by its translation (`translations` in the order
    of `texts(pieces)`), whitespace kept around it."""
    done = iter(translations)
    for piece in pieces:
        if isinstance(piece, Tag):
            nodes = _nodes(piece)
            whole, parts = next(done), [next(done) for _ in nodes]
            if not _inject(piece, nodes, whole, parts):
                for node, translation in zip(nodes, parts):
                    _replace(node, translation)
        else:
            _replace(piece, next(done))
    return tree.decode(formatter=_AsWritten())


def _spaces_around(text):
    """(leading, trailing) whitespace of `text`."""
    return text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]


def _replace(node, translation):
    lead, trail = _spaces_around(str(node))
    node.replace_with(NavigableString(lead + translation + trail))


def _inject(block, nodes, whole, parts):
    """Writes `whole` into the block with each marked element around its own translation (of
    `parts`, the translations of the block's text `nodes`) where `_find` finds it, in order; a
    marked element not found is dropped, its words being in `whole`, unless it carries attributes
    (a link, a styled span): then False, nothing written."""
    spans, start = [], 0
    for node, part in zip(nodes, parts):
        element = node.parent
        if element is block:
            continue
        found = _find(whole, part, start)
        if found:
            spans.append((*found, element))
            start = found[1]
        elif element.attrs:
            return False
    lead, trail = _spaces_around(block.get_text())
    contents, start = [], 0
    for begin, end, element in spans:
        element.contents[0].replace_with(NavigableString(whole[begin:end]))
        contents += [NavigableString(whole[start:begin]), element.extract()]
        start = end
    contents.append(NavigableString(whole[start:]))
    contents[0] = NavigableString(lead + contents[0])
    contents[-1] = NavigableString(contents[-1] + trail)
    block.clear()
    for child in contents:
        if not (isinstance(child, NavigableString) and child == ""):
            block.append(child)
    return True


def _find(whole, part, start):
    """(begin, end) of `part` in `whole` from `start`, its surrounding punctuation and case set
    aside ("Tokyo?" is found in "Tom works in Tokyo."); None where it is not there."""
    core = part.strip(EDGES)
    if not core:
        return None
    folded = len(whole.lower()) == len(whole)  # else lowering would move the indices
    text, key = (whole.lower(), core.lower()) if folded else (whole, core)
    begin = text.find(key, start)
    while begin >= 0 and not _whole_words(whole, begin, begin + len(core)):
        begin = text.find(key, begin + 1)
    return None if begin < 0 else (begin, begin + len(core))


def _whole_words(text, begin, end):
    """False where [begin, end) cuts a word of a script written with spaces ("I don" of "I don't")."""

    def joined(a, b):
        return a.isalnum() and b.isalnum() and max(ord(a), ord(b)) < 0x2E80  # below the CJK blocks

    after = text[end + 1 : end + 2] if text[end : end + 1] in ("'", "’") else text[end : end + 1]
    return not (begin > 0 and joined(text[begin - 1], text[begin])) and not (
        after and joined(text[end - 1], after)
    )
