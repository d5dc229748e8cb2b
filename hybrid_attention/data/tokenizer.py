"""Tokenizers (``byte``, trained ``bpe``, or a Hugging Face tokenizer folder), all as
``transformers.PreTrainedTokenizerFast`` so that a run's tokenizer saves, loads and plugs into ``generate()`` and
lm-eval the same way whatever its kind."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from hybrid_attention.errors import DataError

SPECIAL_TOKENS = ("<bos>", "<eos>", "<pad>")
BYTE_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the alphabet of ``tokenizers``' ByteLevel."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    mapping = dict(zip(bs, map(chr, cs)))
    assert set(mapping.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    return mapping


def _wrap(tk: Tokenizer) -> PreTrainedTokenizerFast:
    bos, eos, pad = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, eos_token=eos, pad_token=pad)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """The default tokenizer: one token per UTF-8 byte (id = byte value), ``<bos>`` 256, ``<eos>`` 257, ``<pad>`` 258:
    vocab 259, no training. Built with the ``tokenizers`` byte-level alphabet and no merges; encoding takes a NumPy
    fast path that gives the same ids (tested)."""
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab.update({tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(list(SPECIAL_TOKENS))
    return _wrap(tk)


def is_byte_tokenizer(tok: PreTrainedTokenizerBase) -> bool:
    """True for the tokenizer of :func:`byte_tokenizer` (also after a save/load round trip)."""
    if len(tok) != BYTE_VOCAB_SIZE:
        return False
    vocab = tok.get_vocab()
    m = bytes_to_unicode()
    return all(vocab.get(m[b]) == b for b in range(256)) and all(
        vocab.get(t) == 256 + i for i, t in enumerate(SPECIAL_TOKENS)
    )


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` (deterministic for a fixed input order)."""
    if vocab_size <= 256 + len(SPECIAL_TOKENS):
        raise DataError(f"data.bpe_vocab_size must exceed {256 + len(SPECIAL_TOKENS)} (256 bytes + specials)")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(texts, trainer=trainer)
    return _wrap(tk)


def load_tokenizer(path: str | os.PathLike, scope: str | os.PathLike | None = None) -> PreTrainedTokenizerBase:
    """Any tokenizer saved with ``save_pretrained`` in a local directory. The directory must pass
    :func:`hybrid_attention.checkpoints.model_folder.check_folder` (no code hooks, no symlink out of ``scope``,
    default the directory itself; weight files are not read here, so pickled ones beside the tokenizer are left to
    the model loader); no code from it is ever run (``trust_remote_code=False``, no prompt)."""
    from hybrid_attention.checkpoints.model_folder import check_folder

    check_folder(path, scope, weights=False)
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot load a tokenizer from {path}: {e}") from e


def separator_id(tok: PreTrainedTokenizerBase) -> int:
    """The document separator: EOS (or SEP) id; DataError when the tokenizer has neither."""
    for sid in (tok.eos_token_id, tok.sep_token_id):
        if sid is not None:
            return int(sid)
    raise DataError(f"tokenizer {tok.name_or_path!r} has no EOS or SEP token to separate documents")


def check_vocab(tok: PreTrainedTokenizerBase, model_vocab_size: int) -> None:
    """DataError when the tokenizer can emit ids that the model's embedding cannot hold."""
    if len(tok) > model_vocab_size:
        raise DataError(
            f"tokenizer has {len(tok)} tokens but the model vocab_size is {model_vocab_size}: "
            f"set model.vocab_size >= {len(tok)} (or leave it unset to follow the tokenizer)"
        )


def encode_documents(tok: PreTrainedTokenizerBase, docs: Sequence[str], batch: int = 256) -> np.ndarray:
    """All documents' ids, each followed by the separator, as one flat int32 array of shape [n_tokens]."""
    sep = separator_id(tok)
    if is_byte_tokenizer(tok):
        parts = [np.frombuffer(d.encode("utf-8"), dtype=np.uint8) for d in docs]
        out = np.empty(sum(len(p) for p in parts) + len(parts), dtype=np.int32)
        pos = 0
        for p in parts:
            out[pos : pos + len(p)] = p
            out[pos + len(p)] = sep
            pos += len(p) + 1
        return out
    chunks = []
    backend = getattr(tok, "backend_tokenizer", None)
    for i in range(0, len(docs), batch):
        part = list(docs[i : i + batch])
        if backend is not None:
            ids = [e.ids for e in backend.encode_batch(part, add_special_tokens=False)]
        else:
            ids = tok(part, add_special_tokens=False)["input_ids"]
        for x in ids:
            chunks.append(np.asarray(x + [sep], dtype=np.int32))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)


def token_byte_lengths(tok: PreTrainedTokenizerBase) -> np.ndarray:
    """UTF-8 bytes each token id stands for, shape [len(tok)], 0 for special tokens (for bits per byte).

    Byte-level vocabularies are counted exactly through the byte alphabet; other vocabularies through decoding each
    token on its own, which can be off by a byte for tokens that carry a leading space marker.
    """
    n = len(tok)
    lengths = np.zeros(n, dtype=np.int64)
    special = set(tok.all_special_ids)
    inverse = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab = tok.get_vocab()
    byte_level = all(all(c in inverse for c in t) for t, i in vocab.items() if i not in special)
    for t, i in vocab.items():
        if i in special or i >= n:
            continue
        lengths[i] = len(t) if byte_level else len(tok.convert_tokens_to_string([t]).encode("utf-8"))
    return lengths
