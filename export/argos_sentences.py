"""The sentence splitter an Argos package carries: kformer's sentence-end rules as a MiniSBD model.

Argos Translate and LibreTranslate split a text into sentences before translating, with a MiniSBD
model (an ONNX graph over characters) that they download on first use unless the package holds
one in `minisbd/`. This graph is that model, written from kformer.decode.sentences' character
sets, so a package translates offline and splits where kformer's runners split. MiniSBD feeds it
`units` (int64 [batch, chars]: ids of the characters in its vocabulary, 1 for the others, 0 for
padding) and `features` (float32 [batch, chars, 0]); its output is one score per class [batch,
chars, 5], of which the splitter uses 0 (inside a sentence) and 2 (the sentence ends here).

A sentence ends after a run of ENDS and the CLOSERS after it when the run holds a full-width
end, the text ends, "!"/"?" meets a character outside the vocabulary (a CJK one, in practice), or
whitespace follows that is neither followed by a lower-case letter nor after a single "." that
ends an abbreviation or a single letter. Where the graph differs from kformer's rules: it looks
at most two characters back for a full-width end or a closer, and a letter outside A-Z counts
as no letter."""

import json
import string

from kformer.decode.sentences import ABBREVIATIONS, CLOSERS, ENDS, OPENERS, WIDE_ENDS

PAD, UNK = "<PAD>", "<UNK>"
VOCAB_PREFIX = [PAD, UNK, "<EMPTY>", "<ROOT>"]  # MiniSBD's reserved ids 0-3
SPACE = " "  # MiniSBD turns every whitespace character into this one
LOWER, LETTERS = string.ascii_lowercase, string.ascii_letters
BANGS = "!?"
CLASSES = 5  # MiniSBD's: 0 inside, 1 token end, 2 sentence end, 3-4 multi-word tokens
SENTENCE_END = 2


def vocabulary():
    """MiniSBD's units: its reserved ids, then every character a rule looks at."""
    return VOCAB_PREFIX + list(dict.fromkeys(ENDS + CLOSERS + OPENERS + SPACE + LETTERS))


def splitter_model(language):
    """The splitter as an onnx.ModelProto, with the metadata MiniSBD reads (config, vocab)."""
    import onnx
    from onnx import TensorProto, helper

    units = vocabulary()
    nodes, tables = _graph(units)
    graph = helper.make_graph(
        nodes,
        "kformer_sentence_ends",
        [
            helper.make_tensor_value_info("units", TensorProto.INT64, ["batch", "chars"]),
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "chars", "features"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "chars", CLASSES])],
        initializer=tables,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kformer")
    model.ir_version = 8  # readable by the onnxruntime releases MiniSBD accepts
    vocab = {"lang": language, "idx": 0, "cutoff": 0, "lower": False}
    vocab.update(_unit2id={u: i for i, u in enumerate(units)}, _id2unit=units)
    config = {"feat_funcs": [], "use_dictionary": False, "num_dict_feat": 0, "batch_size": 32}
    onnx.helper.set_model_props(
        model, {"lang_code": language, "config": json.dumps(config), "vocab": json.dumps(vocab)}
    )
    onnx.checker.check_model(model)
    return model


def _graph(units):
    """(nodes, initializers): per character, whether a sentence ends there, as class scores."""
    import numpy as np
    from onnx import helper, numpy_helper

    nodes, tables = [], {}

    def op(kind, inputs, **attributes):
        output = f"{kind.lower()}_{len(nodes)}"
        nodes.append(helper.make_node(kind, inputs, [output], **attributes))
        return output

    def constant(values):
        return op("Constant", [], value_ints=values)

    def unit_at(by):  # [batch, chars] int64: units[:, t + by], <PAD> (0) outside the text
        if by == 0:
            return "units"
        padded = op("Pad", ["units", constant([0, max(0, -by), 0, max(0, by)])])
        stop = op("Add", [op("Shape", ["units"], start=1), constant([max(0, by)])])
        return op("Slice", [padded, constant([max(0, by)]), stop, constant([1])])

    shifted = {}

    def member(members, by):  # [batch, chars] bool: the unit at t + by is one of `members`
        members = tuple(members)  # of units: a string's characters, or ("<PAD>",)
        if members not in tables:
            values = np.array([u in members for u in units])
            tables[members] = numpy_helper.from_array(values, f"set_{len(tables)}")
        if by not in shifted:
            shifted[by] = unit_at(by)
        return op("Gather", [tables[members].name, shifted[by]])

    def any_of(*flags):
        return flags[0] if len(flags) == 1 else op("Or", [flags[0], any_of(*flags[1:])])

    def all_of(*flags):
        return flags[0] if len(flags) == 1 else op("And", [flags[0], all_of(*flags[1:])])

    def word_before(word, by):  # `word` (any case) ends at t + by, after a space, an opener or nothing
        letters = [member(c + c.upper(), by - len(word) + 1 + i) for i, c in enumerate(word)]
        return all_of(*letters, member((*SPACE, *OPENERS, PAD), by - len(word)))

    in_run = any_of(member(ENDS, 0), all_of(member(CLOSERS, 0), member(ENDS, -1)))
    in_run = any_of(in_run, all_of(member(CLOSERS, 0), member(CLOSERS, -1), member(ENDS, -2)))
    run_ends = all_of(in_run, op("Not", [any_of(member(ENDS, 1), member(CLOSERS, 1))]))
    wide = any_of(*(member(WIDE_ENDS, by) for by in (0, -1, -2)))
    text_ends = member([PAD], 1)
    bang_wide = all_of(member(BANGS, 0), member([UNK], 1))
    lone_dot = all_of(member(".", 0), op("Not", [member(ENDS, -1)]))
    abbreviated = any_of(*(word_before(w, -1) for w in sorted(ABBREVIATIONS | set(LOWER))))
    spaced = all_of(member(SPACE, 1), op("Not", [any_of(member(LOWER, 2), all_of(lone_dot, abbreviated))]))
    ends_here = all_of(run_ends, any_of(wide, text_ends, bang_wide, spaced))
    class_scores = numpy_helper.from_array(
        np.eye(CLASSES, dtype=np.float32)[[0, SENTENCE_END]], "class_scores"
    )
    index = op("Cast", [ends_here], to=7)  # int64: 0 or 1 into class_scores
    nodes.append(helper.make_node("Gather", ["class_scores", index], ["logits"]))
    return nodes, [*tables.values(), class_scores]
