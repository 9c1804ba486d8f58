"""What every imported run folder is made of, whatever its family: the model's weights mapped
name by name (Weights), then config.json, model.keras, import.json and the source's licence
written beside the tokenizer the family wrote (write_run)."""

import dataclasses
import os
import pathlib

from kformer.contracts.digests import files_sha256, tokenizer_digest
from kformer.contracts.pair import LanguagePair
from kformer.contracts.run import IMPORT_FILE, ImportRecord


class Weights(dict):
    """{name: array} of a weights file, taken out one by one as they are mapped; a name it lacks
    is a one-line ValueError naming the file (weights of another shape of model than its config's)."""

    def __init__(self, values, file):
        super().__init__(values)
        self.file = file

    def take(self, name):
        if name not in self:
            raise ValueError(f"{self.file}: no {name}, which the model's config has")
        return self.pop(name)

    def refuse_leftovers(self):
        """Weights the mapping did not take: a part of the network kformer's model lacks."""
        if self:
            raise ValueError(f"{self.file}: weights kformer's model has no place for: {sorted(self)[:5]}")


def attention_values(values, target, heads, projections):
    """Sets `values` for kformer's attention layer `target` from dense (in, out) kernels and their
    biases, `projections` = [(kernel, bias)] of query, key, value and output: kformer's layout is
    (M, H, D) kernels and (H, D) biases, and an (H, D, M) output kernel."""
    *qkv, (kernel, bias) = projections
    for name, (q_kernel, q_bias) in zip(("query", "key", "value"), qkv):
        values[f"{target}/{name}/kernel"] = q_kernel.reshape(q_kernel.shape[0], heads, -1)
        values[f"{target}/{name}/bias"] = q_bias.reshape(heads, -1)
    values[f"{target}/output_projection/kernel"] = kernel.reshape(heads, -1, kernel.shape[1])
    values[f"{target}/output_projection/bias"] = bias


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where an imported model came from: its family ("marian"), its folder or file, its weights
    file, its language pair, its licence (the file's name and bytes; None: the source had none)
    and the sha256 import.json records (None: the weights file's; a package's is the package's)."""

    kind: str
    source: str
    weights_file: str
    pair: LanguagePair
    licence: tuple[str, bytes] | None
    sha256: str | None = None


def write_run(folder, config, values, origin, tokenizer):
    """Writes the imported run into `folder`, where the family wrote `tokenizer`: config.json
    (`config`, a ModelConfig, bound to the tokenizer's digest), model.keras (`values`: {kformer
    variable path: array}), the licence as SOURCE-<name>, and import.json. Returns the ImportRecord."""
    from kformer.model.transformer import Transformer

    config = dataclasses.replace(config, tokenizer_sha256=tokenizer_digest(tokenizer))
    model = Transformer(config)
    for variable in model.weights:
        found = values[variable.path].shape
        if tuple(variable.shape) != found:
            raise ValueError(
                f"{origin.weights_file}: {variable.path} is {found}, not {tuple(variable.shape)}"
            )
        variable.assign(values[variable.path])
    model.save(os.path.join(folder, "model.keras"))
    config.save(os.path.join(folder, "config.json"))
    licence = None
    if origin.licence:
        licence = f"SOURCE-{origin.licence[0]}"
        pathlib.Path(folder, licence).write_bytes(origin.licence[1])
    sha256 = origin.sha256 or files_sha256([origin.weights_file])
    record = ImportRecord(origin.kind, os.path.abspath(origin.source), sha256, origin.pair, licence)
    record.save(os.path.join(folder, IMPORT_FILE))
    return record


def write_vocabulary(folder, config, spms, pieces, order, append_eos=True):
    """Writes a vocabulary tokenizer into `folder` (kformer.data.vocabulary) over the family's
    (source, target) SentencePiece models' bytes `spms`, its `pieces` taken in kformer's id `order`
    (kformer id -> the family's) and the special ids of `config`; returns it loaded."""
    from kformer.data import vocabulary

    ids = {name: getattr(config, name) for name in ("pad_id", "unk_id", "bos_id", "eos_id")}
    vocabulary.write(folder, *spms, [pieces[i] for i in order], ids, append_eos=append_eos)
    return vocabulary.load(folder)


def read_licence(folder, names):
    """(name, bytes) of the first of `names` in `folder`, or None."""
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return name, pathlib.Path(path).read_bytes()
    return None
