"""Corpora, tokenizers, packing and synthetic recall tasks."""

from hybrid_attention.errors import DataError

from .config import DataConfig
from .corpus import Corpus, is_validation, local_corpus, stdlib_corpus
from .lm_data import LMData, build_lm_data, get_tokenizer, load_corpus, validation_tokens
from .mqar import MQARConfig, multiquery_ar, recall_accuracy
from .packing import PackedSequences, ShuffledBatches, StreamingBatches, local_slice
from .passkey import passkey_prompt, passkey_tokens
from .tokenizer import (
    byte_tokenizer,
    check_vocab,
    encode_documents,
    is_byte_tokenizer,
    load_tokenizer,
    token_byte_lengths,
    train_bpe_tokenizer,
)

__all__ = [
    "Corpus",
    "DataConfig",
    "DataError",
    "LMData",
    "MQARConfig",
    "PackedSequences",
    "ShuffledBatches",
    "StreamingBatches",
    "build_lm_data",
    "byte_tokenizer",
    "check_vocab",
    "encode_documents",
    "get_tokenizer",
    "is_byte_tokenizer",
    "is_validation",
    "load_corpus",
    "load_tokenizer",
    "local_corpus",
    "local_slice",
    "multiquery_ar",
    "passkey_prompt",
    "passkey_tokens",
    "recall_accuracy",
    "stdlib_corpus",
    "token_byte_lengths",
    "train_bpe_tokenizer",
    "validation_tokens",
]
