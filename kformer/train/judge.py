"""What keeping the best ranks weights by: the dev sample's BLEU (then chrF), or the mean token
cross-entropy of the whole dev split under the weights a reader would load ("loss").

A fine-tune is judged by the loss by default. Its corpus is small, so its dev split is a few
dozen sentences, and BLEU on a few dozen short sentences is noise: it kept a fine-tune's starting
weights over ones clearly better on the held-out domain. The loss scores every target token of the
same sentences, with no search in between (docs/benchmarks.md measures how often each judge ranks
the better of two models first). A run from scratch, whose dev split is larger and whose
evaluations are far apart, keeps BLEU.
"""

import numpy as np

from kformer.contracts.run import BLEU, LOSS


def default(fine_tune):
    """The judge of a run that does not name one: the loss for a fine-tune, else BLEU."""
    return LOSS if fine_tune else BLEU


def mean_token_loss(model, batches):
    """The mean cross-entropy (no label smoothing, float64 sums) of every non-pad label of
    `batches` (a tf.data of the training batches' form, (x, labels)) under `model`."""
    import tensorflow as tf

    total, tokens = 0.0, 0
    for x, labels in batches:
        logits = tf.cast(model(x, training=False), tf.float32)  # (B, T, V)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)  # (B, T)
        real = tf.not_equal(labels, 0)
        total += float(np.sum(tf.boolean_mask(losses, real).numpy(), dtype=np.float64))
        tokens += int(tf.reduce_sum(tf.cast(real, tf.int32)))
    return total / max(tokens, 1)


def beats(judge, scores, best):
    """Whether `scores` ({"bleu", "chrf", "loss"}) beat the BestRecord `best` (None: nothing yet)."""
    if best is None or best.judge != judge:
        return True
    if judge == LOSS:
        return scores["loss"] < best.loss
    return (scores["bleu"], scores["chrf"]) > (best.bleu, best.chrf)
