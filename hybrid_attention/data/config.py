"""The ``data:`` section of a training config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class DataConfig:
    """Where the text comes from, how it is tokenized and packed.

    ``tokenizer`` is ``byte``, ``bpe`` (trained on the training split and saved with the run) or the path of a local
    Hugging Face tokenizer directory.
    """

    source: Literal["stdlib", "local", "hf", "prose", "text_dir"] = "stdlib"
    # local: files or folders; prose: package roots (default /); text_dir: folders of shards / text files
    paths: list[str] = field(default_factory=list)
    prose_sources: list[str] = field(default_factory=list)  # source=prose: names from data.prose (empty: all)
    hf_name: str | None = None  # dataset name for source=hf, e.g. HuggingFaceFW/fineweb-edu
    hf_config: str | None = None
    hf_split: str = "train"
    text_field: str = "text"  # JSON/parquet/HF field holding the text
    # source=local: the file types read from data.paths (None: .txt .md .rst .html .htm .jsonl .parquet); name .py to
    # read Python sources too, e.g. [.md, .py] (data/corpus.py: LOCAL_SUFFIXES)
    local_suffixes: list[str] | None = None
    val_fraction: float = 0.05
    max_bytes: int | None = None  # read at most this many characters of the corpus (deterministic prefix)
    tokenizer: str = "byte"
    bpe_vocab_size: int = 4096
    seq_len: int = 256
    # How documents share a packed row (documents are joined by EOS and cut into rows of seq_len tokens either way):
    # "concat" (default): one sequence per row, states, convolutions and attention run across document boundaries
    #   (the papers' setting, and the one every stored result in results/ trains with);
    # "varlen": every document starts from a fresh state (the fla/flame practice): the trainer flattens a batch
    #   [B, L] to one row [1, B*L] with cu_seqlens at every document and row start (data.packing.document_offsets).
    pack: Literal["concat", "varlen"] = "concat"
    val_tokens: int = 65536  # validation tokens scored by periodic validation (a fixed prefix of the split)
