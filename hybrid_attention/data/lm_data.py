"""Assemble a language-modelling data pipeline from a :class:`DataConfig`: corpus -> tokenizer -> packed batches."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from hybrid_attention.errors import DataError

from .config import DataConfig
from .corpus import Corpus, hf_streaming_documents, local_corpus, stdlib_corpus
from .packing import PackedSequences, ShuffledBatches, StreamingBatches
from .prose import prose_corpus
from .shards import text_dir_corpus
from .token_cache import cache_dir, cached_ids, documents_key
from .tokenizer import (
    byte_tokenizer,
    encode_documents,
    is_byte_tokenizer,
    load_tokenizer,
    separator_id,
    train_bpe_tokenizer,
)


@dataclass
class LMData:
    """A tokenizer, a resumable stream of global training batches and a flat validation token array [n_val]."""

    tokenizer: PreTrainedTokenizerBase
    train: ShuffledBatches | StreamingBatches
    val_tokens: np.ndarray
    description: str


def load_corpus(cfg: DataConfig) -> Corpus:
    """The in-memory corpus of ``cfg`` (sources ``stdlib``, ``local``, ``prose`` and ``text_dir``)."""
    if cfg.source == "stdlib":
        return stdlib_corpus(cfg.val_fraction, cfg.max_bytes)
    if cfg.source == "local":
        if not cfg.paths:
            raise DataError("data.source=local needs data.paths (files or folders)")
        return local_corpus(cfg.paths, cfg.val_fraction, cfg.text_field, cfg.max_bytes, cfg.local_suffixes)
    if cfg.source == "prose":
        return prose_corpus(cfg.paths, cfg.val_fraction, cfg.max_bytes, cfg.prose_sources)
    if cfg.source == "text_dir":
        if not cfg.paths:
            raise DataError("data.source=text_dir needs data.paths (folders of .jsonl/.txt shards)")
        return text_dir_corpus(cfg.paths, cfg.val_fraction, cfg.max_bytes)
    raise DataError(f"data.source={cfg.source} is not an in-memory corpus")


def get_tokenizer(cfg: DataConfig, corpus: Corpus | None, save_dir: Path | None) -> PreTrainedTokenizerBase:
    """The run's tokenizer. A tokenizer already saved in ``save_dir`` (a resumed run) wins; a new one is saved there."""
    if save_dir is not None and (save_dir / "tokenizer_config.json").exists():
        return load_tokenizer(save_dir)
    if cfg.tokenizer == "byte":
        tok = byte_tokenizer()
    elif cfg.tokenizer == "bpe":
        if corpus is None:
            raise DataError("data.tokenizer=bpe needs an in-memory corpus (not hf); use a tokenizer directory")
        tok = train_bpe_tokenizer(corpus.train, cfg.bpe_vocab_size)
    else:
        tok = load_tokenizer(cfg.tokenizer)
    if save_dir is not None:
        tok.save_pretrained(str(save_dir))
    return tok


def _hf_docs(cfg: DataConfig, part: str):
    """A restartable stream of one side of an HF dataset's hash split."""
    args = (cfg.hf_name, cfg.hf_split, cfg.hf_config, cfg.text_field, part, cfg.val_fraction)
    return lambda: hf_streaming_documents(*args)


def validation_tokens(cfg: DataConfig, tok: PreTrainedTokenizerBase, corpus: Corpus | None = None) -> np.ndarray:
    """The validation split as one flat token array [n] (streamed sources: the first ``cfg.val_tokens`` tokens)."""
    if cfg.source == "hf":
        if not cfg.hf_name:
            raise DataError("data.source=hf needs data.hf_name (e.g. HuggingFaceFW/fineweb-edu)")
        docs = itertools.islice(_hf_docs(cfg, "validation")(), max(1, cfg.val_tokens // 64))
        return encode_documents(tok, list(docs))[: cfg.val_tokens]
    corpus = corpus if corpus is not None else load_corpus(cfg)
    return encode_split(tok, corpus.validation)


def encode_split(tok: PreTrainedTokenizerBase, docs: Sequence[str]) -> np.ndarray:
    """``encode_documents`` of a whole split, read from / stored in the token cache when
    ``$HYBRID_ATTENTION_TOKEN_CACHE`` names a folder and the tokenizer has a ``tokenizers`` serialisation
    (``data/token_cache.py``); the byte tokenizer's NumPy path is faster than the cache's hash and stays uncached."""
    folder, backend = cache_dir(), getattr(tok, "backend_tokenizer", None)
    if folder is None or backend is None or is_byte_tokenizer(tok):
        return encode_documents(tok, docs)
    key = documents_key(backend.to_str(), separator_id(tok), docs)
    return cached_ids(key, lambda: encode_documents(tok, docs), folder)


def build_lm_data(cfg: DataConfig, global_batch: int, seed: int, tokenizer_dir: Path | None = None) -> LMData:
    """Everything the trainer needs from the data side."""
    if cfg.source == "hf":
        tok = get_tokenizer(cfg, None, tokenizer_dir)
        val = validation_tokens(cfg, tok)
        train = StreamingBatches(_hf_docs(cfg, "train"), tok, cfg.seq_len, global_batch)
        desc = f"corpus hf:{cfg.hf_name} (streaming), validation {len(val)} tokens"
        return LMData(tok, train, val, desc)
    corpus = load_corpus(cfg)
    tok = get_tokenizer(cfg, corpus, tokenizer_dir)
    train_tokens = encode_split(tok, corpus.train)
    val = validation_tokens(cfg, tok, corpus)
    if len(val) < cfg.seq_len:
        raise DataError(f"validation split has {len(val)} tokens, fewer than seq_len={cfg.seq_len}")
    train = ShuffledBatches(PackedSequences(train_tokens, cfg.seq_len), global_batch, seed)
    desc = f"{corpus.describe()}; {len(train_tokens):,} train / {len(val):,} validation tokens (vocab {len(tok)})"
    return LMData(tok, train, val, desc)
