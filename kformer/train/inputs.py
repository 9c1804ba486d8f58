"""What training reads of a prepared corpus: the train split's batch stream (from memory or its
shards; each worker's own part under a strategy), the dev split, and for a fine-tuning run the
original run's train split mixed into the stream (`with_original`)."""

import dataclasses
import logging

from kformer.contracts.prepared import PreparedCorpus
from kformer.data import batches as batches_lib
from kformer.data import prepare as prepare_lib
from kformer.data import shards as shards_lib
from kformer.train import distributed

log = logging.getLogger("kformer")


@dataclasses.dataclass(frozen=True)
class TrainingCorpus:
    """What training reads of a prepared corpus: where it is, its manifest, the dev split's ids,
    and the lengths of the train pairs that fit the model (source, target, pairs of each)."""

    folder: str
    manifest: PreparedCorpus
    dev: batches_lib.EncodedPairs
    lengths: tuple["numpy.ndarray", "numpy.ndarray", "numpy.ndarray"]  # noqa: F821
    dev_text: list[tuple[str, str]]  # the dev pairs as text (source, target)
    original: "TrainingCorpus | None" = (
        None  # a fine-tuning run's original corpus, mixed in (`with_original`)
    )
    original_share: float = 0.0  # of the pairs of the batch stream drawn from `original`


def encode(folder, tokenizer, batching):
    """The prepared corpus for training; pairs over the max lengths are dropped, with a warning."""
    manifest = PreparedCorpus.load(folder)
    source, target, counts, dropped = shards_lib.prepared_lengths(manifest, batching)
    dev_text = prepare_lib.held_out(folder, "dev")
    dev = batches_lib.encode_pairs(tokenizer, dev_text, batching)
    for name, count in (("train", dropped), ("dev", dev.dropped_too_long)):
        if count:
            log.warning(
                "%s: dropped %d pairs longer than max lengths (%d source, %d target tokens)",
                name,
                count,
                batching.max_source_length,
                batching.max_target_length,
            )
    return TrainingCorpus(folder, manifest, dev, (source, target, counts), dev_text)


def with_original(encoded, original_folder, share, tokenizer, batching):
    """`encoded` with the prepared corpus at `original_folder` (the run fine-tuning starts from:
    same tokenizer; None: none) beside it, for its dev split and `share` of the batch stream's pairs."""
    if original_folder is None:
        return encoded
    original = encode(original_folder, tokenizer, batching)
    log.info(
        "original corpus %s (%s train pairs): %.0f%% of each batch's pairs on average; its dev split scored too",
        original_folder,
        f"{int(original.lengths[2].sum()):,}",
        100 * share,
    )
    return dataclasses.replace(encoded, original=original, original_share=share)


def check_evaluation(evaluation, encoded, folder):
    if evaluation.early_stop and not (evaluation.on and encoded.dev_text):
        why = "evaluations are off (--eval-minutes 0)" if encoded.dev_text else f"{folder} has no dev split"
        raise ValueError(f"--early-stop needs dev sample evaluations, but {why}")


def steps_per_epoch(encoded, batching, xla):
    """Batches a pass over the train split takes; with the original corpus mixed in, a pass over
    the new pairs takes that many more."""
    source, target, counts = encoded.lengths
    per_epoch = batches_lib.steps_per_epoch_of(source, target, counts, batching, pad_to_bucket=xla)
    per_epoch = round(per_epoch / (1 - encoded.original_share))
    if per_epoch < 1:
        raise ValueError(
            f"the train split ({int(encoded.lengths[2].sum())} pairs) fills no batch of "
            f"batch_tokens={batching.batch_tokens}; lower --batch-tokens"
        )
    return per_epoch


def train_dataset(encoded, batching, xla, seed, workers=1, rank=0):
    """The endless seeded training batches of input worker `rank` of `workers`: its pairs
    (`train_pairs`), with `encoded.original_share` of them drawn from the original corpus at
    random (seeded), then batched by length."""
    import tensorflow as tf

    pairs = train_pairs(encoded, batching, seed, workers, rank)
    if encoded.original_share:
        original = train_pairs(encoded.original, batching, seed + 1, workers, rank)
        weights = [1 - encoded.original_share, encoded.original_share]
        pairs = tf.data.Dataset.sample_from_datasets([pairs, original], weights, seed=seed)
    return batches_lib.batched(pairs, batching, True, xla)


def train_pairs(encoded, batching, seed, workers=1, rank=0):
    """The endless seeded (source, target) id rows of input worker `rank` of `workers` (its part:
    `shards.worker_part`): read into memory when that is small (shards.IN_MEMORY_TOKENS; each pass
    then in a new order of all its pairs), else streamed from its shards (bounded memory)."""
    all_paths = encoded.manifest.shard_paths(encoded.folder)
    paths, num_shards, shard_index = shards_lib.worker_part(all_paths, workers, rank)
    if workers > 1:
        log.info(
            "input worker %d of %d reads %s",
            rank,
            workers,
            f"{len(paths)} of {len(all_paths)} train shards"
            if num_shards == 1
            else f"every {num_shards}th pair of the {len(all_paths)} train shard(s)",
        )
    dtype = encoded.manifest.train.dtype
    source, target, counts = encoded.lengths
    tokens = int(((source + target) * counts).sum()) * len(paths) / len(all_paths) / num_shards
    if tokens <= shards_lib.IN_MEMORY_TOKENS:
        pairs = shards_lib.read_prepared(paths, dtype, batching)
        return batches_lib.endless_pairs(pairs, seed, num_shards, shard_index)
    log.info("streaming %s's train split from %d shards", encoded.folder, len(paths))
    return shards_lib.stream_pairs(paths, dtype, batching, seed, num_shards, shard_index)


def worker_datasets(encoded, batching, xla, seed, strategy, replay):
    """The training batches of a tf.distribute strategy: each worker reads only its part of the
    train split (`train_dataset`) into batches of batch_tokens / replicas tokens, one for each of
    its replicas a step; a resumed run rebuilds and skips the batches already trained on."""
    replicas = strategy.num_replicas_in_sync
    per_replica = dataclasses.replace(batching, batch_tokens=batching.batch_tokens // replicas)

    def worker_dataset(context):
        ds = train_dataset(
            encoded, per_replica, xla, seed, context.num_input_pipelines, context.input_pipeline_id
        )
        return ds.skip(replay * replicas // context.num_input_pipelines) if replay else ds

    workers = distributed.workers(strategy)
    shards = len(encoded.manifest.train.shards)
    if shards >= workers > 1 and shards % workers:
        log.warning(
            "%d train shards over %d workers: some workers read more shards than others, and pass over "
            "their pairs less often (kformer prepare --shards, a multiple of %d, evens them)",
            shards,
            workers,
            workers,
        )
    return strategy.distribute_datasets_from_function(worker_dataset)
