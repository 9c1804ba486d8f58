"""Text in, text out in one ONNX file: onnxruntime-extensions' SentencePiece ops around the core
search graph. Needs onnxruntime-extensions at run time."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from kformer.data.vocabulary import LANGUAGE_CODE_PATTERN
from kformer.export.onnx_rewrite import graphs

CONTRIB = "ai.onnx.contrib"
IR_VERSION = 10  # explicit: onnxruntime 1.31 rejects the IR 14 that newer onnx may default to


def _opsets(opset):
    return [helper.make_opsetid("", opset), helper.make_opsetid(CONTRIB, 1)]


def _const(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _tokenize_graph(tables, pad_id, eos_id):
    """text string (B,) -> source_ids int32 (B, S): a leading language code as its own piece where
    `tables` (kformer.data.vocabulary.graph_tables) split one off, then SentencePiece, its ids
    looked up in the model's vocabulary and EOS appended where they say so, and right padding (the
    core graph keeps the first max_source_length of each row, as for ids)."""
    n = helper.make_node
    nodes = [
        *_language_code(tables.codes, tables.unk_id),  # text -> rest (B,), code_id (B,), code_count (B,)
        *_piece_ids(tables.source, tables.source_map),  # ragged: (M,) pieces, (B+1,) row splits
        n("Slice", ["splits", "zero_1d", "minus_one_1d"], ["starts"]),
        n("Slice", ["splits", "one_1d", "big_1d"], ["ends"]),
        n("Sub", ["ends", "starts"], ["piece_lengths"]),  # (B,)
        n("Add", ["piece_lengths", "code_count"], ["lengths"]),  # (B,) the code, then the pieces
        n("ReduceMax", ["lengths"], ["longest"], keepdims=0),
        n("Add", ["longest", "eos_count"], ["longest_ended"]),
        n("Max", ["longest_ended", "one"], ["width"]),  # at least one column: an all-empty batch runs
        n("Range", ["zero", "width", "one"], ["positions"]),  # (S,)
        n("Unsqueeze", ["starts", "one_1d"], ["starts_2d"]),
        n("Unsqueeze", ["positions", "zero_1d"], ["positions_2d"]),
        n("Unsqueeze", ["lengths", "one_1d"], ["lengths_2d"]),
        n("Unsqueeze", ["code_count", "one_1d"], ["code_count_2d"]),
        n("Sub", ["positions_2d", "code_count_2d"], ["piece_positions"]),  # (B, S): -1 at a code
        n("Add", ["starts_2d", "piece_positions"], ["flat_index"]),  # (B, S) into pieces
        n("Less", ["positions_2d", "lengths_2d"], ["before_end"]),
        n("Less", ["positions_2d", "code_count_2d"], ["is_code"]),  # (B, S) bool
        n("Not", ["is_code"], ["not_code"]),
        n("And", ["before_end", "not_code"], ["real"]),  # (B, S) bool: a piece
        n("Shape", ["pieces"], ["piece_count"]),
        n("Where", ["real", "flat_index", "piece_count"], ["safe_index"]),  # the rest read the appended pad
        n("Concat", ["pieces", "pad_1d"], ["pieces_padded"], axis=0),
        n("Gather", ["pieces_padded", "safe_index"], ["gathered"]),
        n("Equal", ["positions_2d", "lengths_2d"], ["at_end"]),  # (B, S): where EOS goes, if it does
        n("And", ["at_end", "ends_with_eos"], ["eos_here"]),
        n("Where", ["eos_here", "eos", "pad"], ["after"]),
        n("Where", ["real", "gathered", "after"], ["text_ids"]),
        n("Unsqueeze", ["code_id", "one_1d"], ["code_id_2d"]),
        n("Where", ["is_code", "code_id_2d", "text_ids"], ["source_ids"]),
    ]
    return helper.make_graph(
        nodes,
        "tokenize",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("source_ids", TensorProto.INT32, ["batch", "length"])],
        _tokenize_constants(tables, pad_id, eos_id),
    )


def _tokenize_constants(tables, pad_id, eos_id):
    """The initializers of _tokenize_graph's nodes."""
    return [
        _const("eos_count", int(tables.append_eos), np.int64),
        _const("ends_with_eos", bool(tables.append_eos), np.bool_),
        _const("eos", eos_id, np.int32),
        *([] if tables.source_map is None else [_const("source_map", tables.source_map, np.int32)]),
        *_code_constants(tables.codes, tables.unk_id),
        *_tokenizer_options(),
        _const("zero", 0, np.int64),
        _const("one", 1, np.int64),
        _const("zero_1d", [0], np.int64),
        _const("one_1d", [1], np.int64),
        _const("minus_one_1d", [-1], np.int64),
        _const("big_1d", [np.iinfo(np.int64).max], np.int64),
        _const("pad_1d", [pad_id], np.int32),
        _const("pad", pad_id, np.int32),
    ]


def _language_code(codes, unk_id):
    """Nodes: text (B,) -> rest (B,), the text after a leading >>xxx<< code where one is split off;
    code_id (B,) int32, its model id (<unk> for a code none of `codes`); code_count (B,) int64, 1
    where a text has one. Without `codes` (kformer's joint model), the text as it is and no code."""
    n = helper.make_node
    if codes is None:
        no_code = helper.make_tensor("", TensorProto.INT64, [1], [0])
        return [
            n("Identity", ["text"], ["rest"]),
            n("Shape", ["text"], ["batch"]),
            n("ConstantOfShape", ["batch"], ["code_count"], value=no_code),
            n("Cast", ["code_count"], ["code_id"], to=TensorProto.INT32),
        ]
    split = [
        n(
            "StringRegexReplace",
            ["text", "code_pattern", "nothing"],
            ["rest"],
            domain=CONTRIB,
            global_replace=0,
        ),
        n("StringEqual", ["rest", "text"], ["no_code"], domain=CONTRIB),
        n("Not", ["no_code"], ["has_code"]),
        n("Cast", ["has_code"], ["code_count"], to=TensorProto.INT64),
    ]
    if not codes:  # a vocabulary with no language tokens: any code typed is <unk>
        unk = [n("Mul", ["code_count", "zero"], ["none"]), n("Add", ["none", "unk"], ["unk_ids"])]
        return [*split, *unk, n("Cast", ["unk_ids"], ["code_id"], to=TensorProto.INT32)]
    table = "\n".join(f"{code}\t{i}" for code, i in codes.items())
    return [
        *split,
        n(
            "StringRegexReplace",
            ["text", "code_then_all", "the_code"],
            ["code"],
            domain=CONTRIB,
            global_replace=0,
        ),
        n("StringToVector", ["code"], ["code_vector"], domain=CONTRIB, map=table, unk=str(unk_id)),  # (B, 1)
        n("Squeeze", ["code_vector", "one_1d"], ["code_id_64"]),
        n("Cast", ["code_id_64"], ["code_id"], to=TensorProto.INT32),
    ]


def _code_constants(codes, unk_id):
    """The inputs of _language_code's nodes."""
    if codes is None:
        return []
    the_code = [
        _const("code_then_all", [LANGUAGE_CODE_PATTERN + ".*"], np.object_),
        _const("the_code", [r"\1"], np.object_),
    ]
    return [
        _const("code_pattern", [LANGUAGE_CODE_PATTERN], np.object_),
        _const("nothing", [""], np.object_),
        *(the_code if codes else [_const("unk", unk_id, np.int64)]),
    ]


def _piece_ids(source_proto, source_map):
    """Nodes: rest (B,) -> pieces (M,), the model's id of each source piece, and splits (B+1,)."""
    n = helper.make_node
    tokenize = n(
        "SentencepieceTokenizer",
        ["rest", "nbest", "alpha", "add_bos", "add_eos", "reverse"],
        ["spm_ids", "splits"],
        domain=CONTRIB,
        model=source_proto,
    )
    if source_map is None:  # kformer's joint model: its own ids
        return [tokenize, n("Identity", ["spm_ids"], ["pieces"])]
    return [tokenize, n("Gather", ["source_map", "spm_ids"], ["pieces"])]


def _tokenizer_options():
    """SentencepieceTokenizer's option inputs: one segmentation, no sampling, no BOS/EOS of its own."""
    return [
        _const("nbest", 0, np.int64),
        _const("alpha", 0.0, np.float32),
        _const("add_bos", False, np.bool_),
        _const("add_eos", False, np.bool_),
        _const("reverse", False, np.bool_),
    ]


def _detokenize_graph(tables, eos_id, pad_id):
    """tokens int32 (B, N, T) -> translation string (B,): the best (first) of N, cut at EOS,
    padding (and the special tokens: `tables`' -1) removed, looked up in the target
    SentencePiece model, one SentencepieceDecoder call per row (it decodes one sentence at a time)."""
    target_proto, target_map = tables.target, tables.target_map
    n = helper.make_node
    nodes = [
        n("Gather", ["tokens", "zero"], ["best"], axis=1),  # (B, T)
        n("Equal", ["best", "eos"], ["is_eos"]),
        n("Cast", ["is_eos"], ["is_eos_int"], to=TensorProto.INT32),
        n("CumSum", ["is_eos_int", "one"], ["eos_seen"]),
        n("Equal", ["eos_seen", "zero_int"], ["before_eos"]),
        n("Equal", ["best", "pad"], ["is_pad"]),
        n("Not", ["is_pad"], ["not_pad"]),
        n("And", ["before_eos", "not_pad"], ["kept"]),
        n("Identity", ["best"], ["spm_ids"])
        if target_map is None
        else n("Gather", ["target_map", "best"], ["spm_ids"]),  # (B, T) the target model's ids, -1: special
        n("Less", ["spm_ids", "zero_int"], ["no_piece"]),
        n("Not", ["no_piece"], ["has_piece"]),
        n("And", ["kept", "has_piece"], ["keep"]),
        n("Shape", ["best"], ["best_shape"]),
        n("Gather", ["best_shape", "zero"], ["rows"]),
    ]
    nodes += [
        n("Loop", ["rows", "true"], ["texts"], body=_decode_row(target_proto)),  # (B, 1)
        n("Squeeze", ["texts", "one_1d"], ["translation"]),
    ]
    initializers = [
        _const("zero", 0, np.int64),
        _const("one", 1, np.int32),
        _const("zero_int", 0, np.int32),
        _const("eos", eos_id, np.int32),
        _const("pad", pad_id, np.int32),
        _const("true", True, np.bool_),
        _const("one_1d", [1], np.int64),
        *([] if target_map is None else [_const("target_map", target_map, np.int32)]),
    ]
    shape = ["batch", "hypotheses", "steps"]
    return helper.make_graph(
        nodes,
        "detokenize",
        [helper.make_tensor_value_info("tokens", TensorProto.INT32, shape)],
        [helper.make_tensor_value_info("translation", TensorProto.STRING, ["batch"])],
        initializers,
    )


def _decode_row(target_proto):
    """The Loop body of the detokenizer: row i's ids, those kept, -> its text (1,)."""
    n = helper.make_node
    return helper.make_graph(
        [
            n("Gather", ["spm_ids", "i"], ["row"], axis=0),
            n("Gather", ["keep", "i"], ["row_keep"], axis=0),
            n("Compress", ["row", "row_keep"], ["row_ids"], axis=0),
            n("Cast", ["row_ids"], ["row_ids64"], to=TensorProto.INT64),
            n("SentencepieceDecoder", ["row_ids64"], ["row_text"], domain=CONTRIB, model=target_proto),
            n("Identity", ["condition"], ["condition_out"]),
        ],
        "decode_row",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("condition", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("condition_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("row_text", TensorProto.STRING, [1]),
        ],
    )


def _prefixed(graph, prefix, keep):
    """Renames every value of one of our graphs (its Loop body included, where outer values are
    referenced by name) except the interface names in `keep`, so it cannot clash with the core."""

    def rename(name):
        return name if not name or name in keep else prefix + name

    for g in graphs(graph):
        for node in g.node:
            node.input[:] = [rename(x) for x in node.input]
            node.output[:] = [rename(x) for x in node.output]
            node.name = f"{node.output[0]}/{node.op_type}"  # unique: every node has its own first output
        for value in (*g.input, *g.output):
            value.name = rename(value.name)
        for tensor in g.initializer:
            tensor.name = rename(tensor.name)
    return graph


def build_text_model(core, tables, config, opset):
    """core: the ids ONNX model of one search (source_ids, options -> tokens, scores); tables: the
    tokenizer's (kformer.data.vocabulary.graph_tables). Returns text, options -> translation.

    The three graphs are concatenated in order (tokenize, search, detokenize) rather than merged
    with onnx.compose, whose pruning cannot see the outer-scope values the core's Loop body
    reads, and whose renaming does not reach them either."""
    pre = _prefixed(
        _tokenize_graph(tables, config["pad_id"], config["eos_id"]),
        "tokenize/",
        keep={"text", "source_ids"},
    )
    post = _prefixed(
        _detokenize_graph(tables, config["eos_id"], config["pad_id"]),
        "detokenize/",
        keep={"translation"},
    )
    # The detokenizer takes (B, N, T): greedy search's (B, T) gets its N = 1.
    tokens = next(o for o in core.graph.output if o.name == "tokens")
    if len(tokens.type.tensor_type.shape.dim) == 2:
        hypotheses = [
            helper.make_node("Unsqueeze", ["tokens", "detokenize/hypotheses_axis"], ["detokenize/tokens"])
        ]
        post.initializer.append(_const("detokenize/hypotheses_axis", [1], np.int64))
    else:
        hypotheses = [helper.make_node("Identity", ["tokens"], ["detokenize/tokens"])]
    graph = helper.make_graph(
        [*pre.node, *core.graph.node, *hypotheses, *post.node],
        "kformer_text_translator",
        [*pre.input, *(i for i in core.graph.input if i.name != "source_ids")],
        list(post.output),
        [*pre.initializer, *core.graph.initializer, *post.initializer],
    )
    graph.value_info.extend(core.graph.value_info)
    model = helper.make_model(graph, opset_imports=_opsets(opset))
    model.ir_version = IR_VERSION
    return model
