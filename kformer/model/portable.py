"""Export-safe spellings: operations written the way every exported runtime can run them well.

The decoding loop runs identically in Keras, SavedModel, TFLite, onnxruntime and the browser. Some
plain operations convert badly to one of them: into many nodes per decoding step, into an operator
that copies a whole buffer each step, or into nothing runnable. Each function here is the spelling
that converts well, says which runtime needs it, and, where kformer.export.onnx_rewrite turns the
ONNX file's nodes back into a faster form, which rewrite does. The layers and the searches call
these instead of spelling the operations themselves, so the constraints live in one place.

Shape letters: B batch (or rows), H heads, T buffer length, D head size, K beams, V vocabulary.
"""

import math

import keras
import tensorflow as tf
from keras import ops


def contract(x, kernel, axes=1, bias=None):
    """tensordot(x, kernel, axes) [+ bias]: x's last `axes` dims against kernel's first `axes` dims.

    For TFLite and ONNX: when every dim of x but the batch is known as the graph is traced (a
    decoding step's (B, M)), one matmul with reshapes of constant shape, the bias added to its
    (rows, N) result: one TFLite FULLY_CONNECTED (with its bias) and one ONNX Gemm. A tensordot
    reads x's shape at run time instead (ten TFLite ops, seven ONNX nodes, for each product of a
    decoder step). Not a rank-3 by rank-2 tf.matmul, which exports as one node but which
    TensorFlow runs slower. Otherwise (training: lengths vary) a tensordot, which
    TensorFlow differentiates as one plain matmul.
    """
    known = x.shape[1:]
    if None in known:
        product = ops.tensordot(x, kernel, axes)
        return product if bias is None else product + bias
    size = math.prod(known[len(known) - axes :])  # K: the contracted dims, flattened
    rows = x if len(x.shape) == 2 else ops.reshape(x, (-1, size))  # (rows, K)
    product = ops.matmul(rows, ops.reshape(kernel, (size, -1)))  # (rows, N)
    if bias is not None:
        product = product + ops.reshape(bias, (-1,))
    shape = (*known[: len(known) - axes], *kernel.shape[axes:])  # the result's dims after the batch
    return product if len(shape) == 1 else ops.reshape(product, (-1, *shape))


def lookup(table, ids):
    """table[ids]: tf.gather, not keras.ops.take, which also wraps negative indices (three more
    nodes per lookup in every exported decoding step; ids and positions are never negative)."""
    return tf.gather(table, ids)


def one_query_scores(q, k):
    """A decoding step's attention scores: q (B, H, 1, D) against keys (B, H, T, D) -> (B, H, T).

    A broadcast multiply and a sum, not a batched matmul with one query row, which TFLite's
    XNNPACK runs by repacking the whole key buffer at every step. ONNX: onnx_rewrite's
    _attention_products turns it back into a MatMul, which onnxruntime runs faster."""
    return ops.sum(q * k, axis=-1)


def one_query_context(weights, v):
    """A decoding step's attention output: weights (B, H, T) over values (B, H, T, D) -> (B, H, D).
    Spelled and undone as `one_query_scores`."""
    return ops.sum(ops.expand_dims(weights, -1) * v, axis=2)


def add_to_slot(buffer, slot, values):
    """buffer + slot * values: writes values (B, H, 1, D) into the slot (1, 1, T, 1) of a
    key/value buffer (B, H, T, D) that is still zero there (buffers start as zeros and each step
    writes the next slot). Fixed shapes, no dynamic-update-slice (which TFLite and ONNX cannot
    run in a loop as they must), and two exported nodes where a select is three."""
    return buffer + slot * values


def write_slot(buffer, slot, values):
    """buffer[..., i] = values where (T,) `slot` is True at i alone: a one-hot blend (a select),
    for the output-token buffers, whose slots are not zero (pad is a token). No
    dynamic-update-slice, as `add_to_slot`."""
    return tf.where(slot, tf.expand_dims(values, -1), buffer)


# top_tokens ranks a row's V logits in chunks of the first of these that divides V (V / chunk >= k).
# TFLite's TOPK_V2 and onnxruntime's TopK rank each row on its own and slowly for a row as long as
# a vocabulary: ranking chunks first, then the chunks' winners, made a batch's step faster in both,
# and one row's about as fast. 32 was the best chunk count measured (`kformer bench runtimes`).
TOP_K_CHUNKS = (32, 16, 8)


def top_tokens(logits, k, whole=False):
    """(rows, V) logits -> (rows, k) int32 ids of the k largest, largest first, ties to the lower
    id: the tokens of tf.math.top_k(logits, k), found in two smaller rankings.

    The chunks of C logits are ranked by their largest (a reduce, (rows, V / C)); the k best chunks
    hold the k largest logits (a logit outside them is beaten by the largest of each of k chunks,
    and by a tie of a chunk before it), and the k * C logits of those chunks, in id order (the
    chunk ids sorted, so ties still go to the lower id), are ranked again. A V with no chunk size
    in TOP_K_CHUNKS (or too few chunks) is ranked whole, and so is the top 1 with `whole`: the ONNX
    files' greedy search, since onnxruntime ranks one row's top 1 faster whole, where in chunks it
    was slower at batch 1 (more nodes a step) and no faster on a file."""
    vocab = logits.shape[-1]
    chunk = next((c for c in TOP_K_CHUNKS if vocab is not None and vocab % c == 0 and vocab // c >= k), None)
    if chunk is None or (k == 1 and whole):
        return tf.math.top_k(logits, k=k)[1]
    chunks = tf.reshape(logits, [-1, vocab // chunk, chunk])  # (rows, V / C, C)
    _, best = tf.math.top_k(tf.reduce_max(chunks, axis=2), k=k)  # (rows, k) chunk ids
    if k == 1:  # greedy: the token is in the one chunk (fewer nodes a step)
        _, picked = tf.math.top_k(tf.squeeze(tf.gather(chunks, best, batch_dims=1), 1), k=1)  # (rows, 1)
        return best * chunk + picked
    best = -tf.math.top_k(-best, k=k)[0]  # in id order
    candidates = tf.reshape(tf.gather(chunks, best, batch_dims=1), [-1, k * chunk])  # (rows, k * C)
    _, picked = tf.math.top_k(candidates, k=k)  # (rows, k) into k * C
    return tf.gather(best, picked // chunk, batch_dims=1) * chunk + picked % chunk


def top_log_probs(logits, k, floor, whole=False):
    """The k most probable tokens of each row of (rows, V) logits: ((rows, k) log-probabilities,
    (rows, k) token ids).

    Ranks the logits (`top_tokens`; top_k, never argmax, which not every runtime has for every
    type) and takes the log of the picked tokens' probabilities alone, read from one softmax: the
    same tokens and values, up to float rounding, as ranking log_softmax(logits), without a (rows,
    V) tensor of log-probabilities for TFLite to rank. Softmax is one vectorized kernel in XNNPACK
    and onnxruntime: in LiteRT faster than the log-sum-exp spelled out (max, subtract, exp, sum,
    log), in onnxruntime as fast as its LogSoftmax. A probability of
    0 (a banned token's, or one float32 cannot hold, ~100 nats below the best) reads `floor`, not
    -inf, which would turn 0 * inf into NaN in the searches' blends; the most probable token's is at
    least 1 / V, so the top 1 needs no floor. whole: as `top_tokens`'.
    """
    logits = tf.cast(logits, tf.float32)
    tokens = top_tokens(logits, k, whole)
    log_probs = tf.math.log(tf.gather(tf.nn.softmax(logits), tokens, batch_dims=1))
    return (log_probs if k == 1 else tf.maximum(log_probs, floor)), tokens


def loop_condition(length, rows_left):
    """A search loop's condition on its state `s` (fields index, done): the step index is within
    the buffers of `length`, and more than `rows_left` rows are not done.

    For tf2onnx: no `maximum_iterations` (a second counter repeating the first test), and <= / >=
    against bounds computed once (tf2onnx casts both sides of an int32 < or > to float, two Cast
    nodes a test)."""
    last, at_least = length - 1, rows_left + 1

    def cond(s):
        running = tf.reduce_sum(tf.cast(tf.logical_not(s.done), tf.int32))
        return tf.logical_and(s.index <= last, running >= at_least)

    return cond


def shape_in_loop(like):
    """The shape of `like`, a tensor computed in a loop body, as the shape argument of an operation
    in that body (scatter_nd, reshape, fill). LiteRT plans a loop body's memory once, if every
    tensor's shape is known when the body is prepared: tf.shape of a tensor of the body is (LiteRT
    computes it then); a shape computed from loop variables (a stacked (B * K, T), B * V) is known
    only as the step runs. Such a tensor is re-allocated at every step, as a top_k's outputs are
    (kformer.export.tflite keeps their converter's signatures)."""
    return tf.shape(like)


def empty_to_append(ids, *dims, dtype="float32"):
    """Zeros of shape (B, dims[0], 0, *dims[1:]) for a (B, ...) int tensor `ids` of values >= 0,
    whose third dim no converter knows to be 0: a loop variable that grows along it (`tf.concat`
    each step) must not start with a static length, or the TFLite converter and tf2onnx give the
    loop's result the start's shape and refuse the body's. The length is a 0 computed from the
    values of `ids` at run time, max(min(min(ids), 0), 0): a file with fixed input shapes knows
    every shape, so one derived from them would be folded to a constant."""
    length = tf.maximum(tf.minimum(tf.reduce_min(ids), 0), 0)
    return tf.zeros(tf.stack([tf.shape(ids)[0], dims[0], length, *dims[1:]]), dtype)


def extend(t, length, axis, value=0):
    """t with `value` appended along `axis` up to `length`. A concatenation, not tf.pad: the
    TFLite converter loses every dim of a pad with run-time paddings, and a loop variable whose
    shape it lost is copied through a CAST at every step."""
    shape = tf.shape(t)
    axis = axis % t.shape.rank
    filler = tf.fill(
        tf.concat([shape[:axis], [length - shape[axis]], shape[axis + 1 :]], 0), tf.cast(value, t.dtype)
    )
    return tf.concat([t, filler], axis=axis)


def repeat_rows(tree, times):
    """(B, ...) -> (B * times, ...) for every tensor of a nest: each row repeated, copies adjacent.
    A gather, not tf.repeat: the TFLite converter loses every dim of a repeat's output, and then
    copies each key/value buffer once per step to fit the loop variables' declared shapes. The
    row indices are computed once for every tensor (B is the same for all)."""
    batch = tf.shape(tf.nest.flatten(tree)[0])[0]
    rows = tf.range(batch * times) // times  # (B * times,)
    return tf.nest.map_structure(lambda t: tf.gather(t, rows), tree)


def activation(name, x):
    """The feed-forward's activation: "relu", "gelu" (exact, with erf) or "swish" (x sigmoid(x)).
    Swish spelled out, not keras' silu: TensorFlow's silu carries a custom gradient that a frozen
    graph cannot save (the TFLite and ONNX converters fail on it)."""
    if name == "swish":
        return x * ops.sigmoid(x)
    return keras.activations.get(name)(x)
