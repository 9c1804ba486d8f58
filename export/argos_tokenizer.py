"""The one SentencePiece model an Argos package holds (`sentencepiece.model`): Argos segments each
source sentence with it (`encode(out_type=str)`) and joins the output pieces with it
(`decode_pieces`). A kformer-trained model has one tokenizer for both sides, which is that file.
An import whose tokenizer is a vocabulary over a source and a target model (OPUS-MT's) gets the
source model with its joiner's other pieces (the target model's and the vocabulary's:
kformer.data.vocabulary) appended as UNUSED pieces:
- SentencePiece never segments into an unused piece, nor counts one in the unknown piece's score
  (its minimum is over normal pieces), so sources segment exactly as by the source model;
- decode_pieces turns an unused piece into its text as any other, so outputs join as the target
  model joins them (as the joiner does, in every runtime), with the target's denormalization.
The two models must share their whitespace rules (what decoding reads of the normalizer), and the
target must not fall back to bytes: otherwise the export says so in one line."""

from kformer.data.vocabulary import UNUSED, maps_through_vocabulary, with_pieces

WHITESPACE_RULES = ("add_dummy_prefix", "remove_extra_whitespaces")


def package_tokenizer(tokenizer):
    """The bytes of the package's sentencepiece.model for `tokenizer` (a SentencePieceProcessor or
    a VocabularyTokenizer)."""
    if not maps_through_vocabulary(tokenizer):
        return tokenizer.serialized_model_proto()
    return source_with_target_pieces(tokenizer.source, tokenizer.joiner)


def source_with_target_pieces(source, target):
    """`source` (a SentencePieceProcessor) with each piece of `target` it lacks as an UNUSED piece,
    and the target's denormalization: serialized ModelProto bytes."""
    from sentencepiece import sentencepiece_model_pb2

    model_proto = sentencepiece_model_pb2.ModelProto
    merged = model_proto.FromString(source.serialized_model_proto())
    joiner = model_proto.FromString(target.serialized_model_proto())
    for rule in WHITESPACE_RULES:
        if getattr(merged.normalizer_spec, rule) != getattr(joiner.normalizer_spec, rule):
            raise ValueError(
                f"--formats argos: the source and target SentencePiece models differ in {rule}, and an "
                "Argos package joins its outputs with the one model it segments sources with"
            )
    if joiner.trainer_spec.byte_fallback:
        raise ValueError(
            "--formats argos: the target SentencePiece model falls back to bytes, which the package's "
            "one model (the source's) cannot join"
        )
    known = {piece.piece for piece in merged.pieces}
    merged.denormalizer_spec.CopyFrom(joiner.denormalizer_spec)
    missing = [piece.piece for piece in joiner.pieces if piece.piece not in known]
    return with_pieces(merged.SerializeToString(), missing, UNUSED)
