"""format=html: a web page's text translated with its markup kept (BeautifulSoup on Python's
html.parser, which reads any page, malformed ones included, into a tree).

Every text node outside SKIPPED elements is translated on its own, with its leading and trailing
whitespace kept, so inline markup stays where it was: `Hello <b>world</b>` is "Hello" and "world".
Tags, attributes, comments, SKIPPED elements' contents and entities come out as they went in
(entities written by name: &nbsp; stays &nbsp;); a tag left open is closed where the parser
closes it, the one defined result for a malformed page."""

from bs4 import BeautifulSoup, Comment, Declaration, Doctype, NavigableString, ProcessingInstruction
from bs4.formatter import HTMLFormatter

SKIPPED = frozenset(
    {"script", "style", "code", "pre", "kbd", "samp", "var", "textarea", "noscript", "template"}
)
NOT_TEXT = (Comment, Declaration, Doctype, ProcessingInstruction)


class _AsWritten(HTMLFormatter):
    """Named entities where the character has one, attributes in the page's order."""

    def __init__(self):
        super().__init__(entity_substitution=HTMLFormatter.REGISTRY["html"].entity_substitution)

    def attributes(self, tag):
        return list(tag.attrs.items())


def parse(page):
    """(the page's tree, its text nodes to translate, in order)."""
    tree = BeautifulSoup(page, "html.parser")
    nodes = [
        node
        for node in tree.find_all(string=True)
        if not isinstance(node, NOT_TEXT)
        and node.strip()
        and not any(parent.name in SKIPPED for parent in node.parents)
    ]
    return tree, nodes


def texts(nodes):
    """What each text node says, without its surrounding whitespace."""
    return [node.strip() for node in nodes]


def rebuilt(tree, nodes, translations):
    """The page with each node's text replaced by its translation, whitespace kept around it."""
    for node, translation in zip(nodes, translations):
        text = str(node)
        lead = text[: len(text) - len(text.lstrip())]
        trail = text[len(text.rstrip()) :]
        node.replace_with(NavigableString(lead + translation + trail))
    return tree.decode(formatter=_AsWritten())
