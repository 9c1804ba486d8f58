"""format=html: a web page's text translated with its markup kept (BeautifulSoup's tree, built by
lxml's HTML parser, libxml2's: it reads any page, malformed ones included, in time linear in its
length, where Python's html.parser takes quadratic time on unclosed tags, comments and quotes).
A fragment comes back a fragment: the html, head and body elements that lxml adds around one are
taken out again. Every step over the tree is linear too (an explicit stack, each element looked
at once), so a page of 10,000 nested tags costs what its length says.

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
closes it, the one defined result for a malformed page (what cannot be a tag is text, or a
comment where a browser makes it one: `<![CDATA[...]]>`, `<?xml ...?>`)."""

import dataclasses
import re
import unicodedata
import warnings

from bs4 import (
    BeautifulSoup,
    Comment,
    Declaration,
    Doctype,
    NavigableString,
    ProcessingInstruction,
    Tag,
    XMLParsedAsHTMLWarning,
)
from bs4.formatter import HTMLFormatter

from kformer.serve import cost

SKIPPED = frozenset(
    {"script", "style", "code", "pre", "kbd", "samp", "var", "textarea", "noscript", "template"}
)
# Elements that mark words inside a sentence, not a sentence of their own.
INLINE = frozenset("a abbr b cite dfn em i mark q s small span strong sub sup u".split())
NOT_TEXT = (Comment, Declaration, Doctype, ProcessingInstruction)
IMPLIED = ("html", "head", "body")  # what lxml puts around a fragment
# A page may be this many times the characters a request may translate, markup included: checked
# before it is parsed. Web pages are mostly markup; what this bounds is the parser's work.
MARKUP_ALLOWANCE = 20
# What a translation's edges may carry that the whole's may not at that place: punctuation, spaces.
EDGES = "".join(chr(c) for c in range(0x10000) if unicodedata.category(chr(c))[0] in "PZ" or chr(c).isspace())


class _AsWritten(HTMLFormatter):
    """Named entities where the character has one, attributes in the page's order; a text node
    in `translated` (its id -> text) is written as that text. Text is replaced as the page is
    written, not in the tree: bs4 finds a node among its siblings one by one to replace it, which
    made an element of many text nodes quadratic."""

    def __init__(self, translated):
        super().__init__(entity_substitution=HTMLFormatter.REGISTRY["html"].entity_substitution)
        self.translated = translated

    def attributes(self, tag):
        return list(tag.attrs.items())

    def substitute(self, ns):
        return super().substitute(self.translated.get(id(ns), ns))


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


def _block(node, inline):
    """The element whose text runs inline through `node`, or None; `inline` remembers
    `_runs_inline` of each element asked about (id -> bool), so each is looked at once."""
    for holder in (node.parent, node.parent.parent if _is_marked_words(node.parent) else None):
        if holder is None:
            continue
        if id(holder) not in inline:
            inline[id(holder)] = _runs_inline(holder)
        if inline[id(holder)]:
            return holder
    return None


def _text_nodes(tree):
    """The text nodes with text outside SKIPPED elements, in order (an explicit stack: a page may
    nest deeper than Python's recursion)."""
    found, stack = [], [iter(tree.contents)]
    while stack:
        child = next(stack[-1], None)
        if child is None:
            stack.pop()
        elif isinstance(child, Tag):
            if child.name not in SKIPPED:
                stack.append(iter(child.contents))
        elif _is_text(child) and child.strip():
            found.append(child)
    return found


def parse(page):
    """(the page's tree, its pieces to translate, in order: text nodes, and elements whose text
    runs through inline elements)."""
    # "<?xml ...?>" makes bs4 suggest its XML parser
    with warnings.catch_warnings(action="ignore", category=XMLParsedAsHTMLWarning):
        tree = BeautifulSoup(page, "lxml")
    _as_written(tree, page)
    pieces, inline = [], {}
    for node in _text_nodes(tree):
        piece = _block(node, inline) or node
        if not pieces or pieces[-1] is not piece:
            pieces.append(piece)
    return tree, pieces


def _as_written(tree, page):
    """Undoes what lxml adds to a fragment: the html, head and body elements the page did not
    write, and the whitespace it drops before the first thing in the page."""
    written = {m.group(1).lower() for m in re.finditer(r"<(html|head|body)[\s/>]", page, re.IGNORECASE)}
    for name in [name for name in IMPLIED if name not in written]:
        for parent in (tree, tree.find("html", recursive=False)):
            for element in parent.find_all(name, recursive=False) if parent is not None else ():
                element.unwrap()
    lead = page[: len(page) - len(page.lstrip())]
    first = tree.contents[0] if tree.contents else None
    if lead and not (_is_text(first) and first[:1].isspace()):
        if _is_text(first):
            first.replace_with(NavigableString(lead + first))
        else:
            tree.insert(0, NavigableString(lead))


@dataclasses.dataclass(frozen=True)
class Pages:
    """Pages read for translation (`read`): each one's tree and pieces, the texts to translate of
    all of them in order, how many of those are each page's, and what they are charged."""

    parsed: list  # (tree, pieces) of each page
    texts: list
    counts: list
    charged: int


def read(pages):
    """The Pages of a request's pages (web pages as text)."""
    parsed = [parse(page) for page in pages]
    texts_of = [texts(pieces) for _, pieces in parsed]
    return Pages(
        parsed,
        [text for page in texts_of for text in page],
        [len(page) for page in texts_of],
        sum(max(cost.SENTENCE_FLOOR, charged(pieces)) for _, pieces in parsed),  # a page is a text
    )


def written(pages, translations):
    """Each page of `pages` (Pages) rebuilt around its texts' `translations` (all pages', in order)."""
    done = iter(translations)
    return [
        rebuilt(tree, pieces, [next(done) for _ in range(count)])
        for (tree, pieces), count in zip(pages.parsed, pages.counts)
    ]


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
    done, translated = iter(translations), {}
    for piece in pieces:
        if isinstance(piece, Tag):
            nodes = _nodes(piece)
            whole, parts = next(done), [next(done) for _ in nodes]
            if not _inject(piece, nodes, whole, parts, translated):
                translated.update((id(node), _spaced(node, part)) for node, part in zip(nodes, parts))
        else:
            translated[id(piece)] = _spaced(piece, next(done))
    return tree.decode(formatter=_AsWritten(translated))


def _spaces_around(text):
    """(leading, trailing) whitespace of `text`."""
    return text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]


def _spaced(node, translation):
    """The translation of a text node with the node's leading and trailing whitespace."""
    lead, trail = _spaces_around(str(node))
    return lead + translation + trail


def _inject(block, nodes, whole, parts, translated):
    """Writes `whole` into the block with each marked element around its own translation (of
    `parts`, the translations of the block's text `nodes`, written into `translated`) where
    `_Finder` finds it, in order; a marked element not found is dropped, its words being in
    `whole`, unless it carries attributes (a link, a styled span): then False, nothing written."""
    spans, start, finder = [], 0, _Finder(whole)
    for node, part in zip(nodes, parts):
        element = node.parent
        if element is block:
            continue
        found = finder.find(part, start)
        if found:
            spans.append((*found, element))
            start = found[1]
        elif element.attrs:
            return False
    lead, trail = _spaces_around(block.get_text())
    block.clear()  # the marked elements found come back below, around their translations
    contents, start = [], 0
    for begin, end, element in spans:
        translated[id(element.contents[0])] = whole[begin:end]
        contents += [NavigableString(whole[start:begin]), element]
        start = end
    contents.append(NavigableString(whole[start:]))
    contents[0] = NavigableString(lead + contents[0])
    contents[-1] = NavigableString(contents[-1] + trail)
    for child in contents:
        if not (isinstance(child, NavigableString) and child == ""):
            block.append(child)
    return True


class _Finder:
    """Finds the translations of marked words in the translation of their sentence, in order
    (`find`), its edge punctuation and case set aside, whole words only ("Tokyo?" is found in
    "Tom works in Tokyo."). The sentence is lowered once, and at most TRIES places a character of
    it are tried in all: many marks of a common word cost what the sentence's length says (a mark
    past that is not found)."""

    TRIES = 4

    def __init__(self, whole):
        lowered = whole.lower()
        self.whole, self.folded = whole, len(lowered) == len(whole)  # else lowering moves indices
        self.text = lowered if self.folded else whole
        self.tries = self.TRIES * len(whole) + 16

    def find(self, part, start):
        """(begin, end) of `part` in the sentence from `start`, or None."""
        core = part.strip(EDGES)
        if not core:
            return None
        begin = self.text.find(core.lower() if self.folded else core, start)
        while begin >= 0 and self.tries > 0:
            self.tries -= 1
            if _whole_words(self.whole, begin, begin + len(core)):
                return begin, begin + len(core)
            begin = self.text.find(core.lower() if self.folded else core, begin + 1)
        return None


def _whole_words(text, begin, end):
    """False where [begin, end) cuts a word of a script written with spaces ("I don" of "I don't")."""

    def joined(a, b):
        return a.isalnum() and b.isalnum() and max(ord(a), ord(b)) < 0x2E80  # below the CJK blocks

    after = text[end + 1 : end + 2] if text[end : end + 1] in ("'", "’") else text[end : end + 1]
    return not (begin > 0 and joined(text[begin - 1], text[begin])) and not (
        after and joined(text[end - 1], after)
    )
