"""Packing token streams into fixed-length sequences and iterating over them deterministically and resumably.

Both batch streams hand out *global* batches ``[global_batch, seq_len]`` (every rank of a distributed run draws the
same global batch and keeps its slice, see :func:`local_slice`) and describe their position with a JSON-serialisable
``state_dict()``; ``load_state_dict()`` continues exactly where that position was taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from hybrid_attention.errors import DataError

from .tokenizer import encode_documents


class PackedSequences:
    """Non-overlapping windows ``tokens[i*L:(i+1)*L]`` of one flat token array (documents joined by EOS)."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        if seq_len < 2:
            raise DataError(f"seq_len must be >= 2, got {seq_len}")
        self.tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self.seq_len = seq_len
        if len(self) == 0:
            raise DataError(f"corpus of {len(tokens)} tokens is shorter than one sequence of {seq_len} tokens")

    def __len__(self) -> int:
        return len(self.tokens) // self.seq_len

    def get(self, indices: torch.Tensor | list[int]) -> torch.Tensor:
        """Sequences ``indices`` as int64, shape [len(indices), seq_len]."""
        idx = torch.as_tensor(indices, dtype=torch.long).numpy()
        rows = self.tokens[: len(self) * self.seq_len].reshape(len(self), self.seq_len)[idx]
        return torch.from_numpy(rows.astype(np.int64))


class ShuffledBatches:
    """Global batches drawn without replacement from a fresh permutation each epoch (``seed`` and epoch fix it).

    The last incomplete batch of an epoch is dropped. Position: ``{"epoch", "batch"}`` = batches taken in the epoch.
    """

    def __init__(self, sequences: PackedSequences, batch_size: int, seed: int = 0):
        if len(sequences) < batch_size:
            raise DataError(
                f"training data has {len(sequences)} sequences of {sequences.seq_len} tokens, fewer than one global "
                f"batch of {batch_size}: use more data, a shorter seq_len or a smaller batch"
            )
        self.sequences, self.batch_size, self.seed = sequences, batch_size, seed
        self.epoch, self.batch = 0, 0
        self._perm: tuple[int, torch.Tensor] | None = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.sequences) // self.batch_size

    def _permutation(self) -> torch.Tensor:
        if self._perm is None or self._perm[0] != self.epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._perm = (self.epoch, torch.randperm(len(self.sequences), generator=g))
        return self._perm[1]

    def next_batch(self) -> torch.Tensor:
        """The next global batch, shape [batch_size, seq_len], int64."""
        if self.batch >= self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
        idx = self._permutation()[self.batch * self.batch_size : (self.batch + 1) * self.batch_size]
        self.batch += 1
        return self.sequences.get(idx)

    def state_dict(self) -> dict:
        return {"kind": "shuffled", "epoch": self.epoch, "batch": self.batch, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != "shuffled" or state.get("seed") != self.seed:
            raise DataError(f"data position {state} does not belong to a shuffled stream with seed {self.seed}")
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


class StreamingBatches:
    """Global batches packed in order from a document stream (e.g. HF streaming); restarts the stream each epoch.

    Position: ``{"epoch", "sequences"}``; resuming re-reads the stream and skips that many sequences.
    """

    def __init__(
        self,
        documents: Callable[[], Iterator[str]],
        tokenizer: PreTrainedTokenizerBase,
        seq_len: int,
        batch_size: int,
        docs_per_chunk: int = 64,
    ):
        self.documents, self.tokenizer = documents, tokenizer
        self.seq_len, self.batch_size, self.docs_per_chunk = seq_len, batch_size, docs_per_chunk
        self.epoch, self.sequences = 0, 0
        self._it: Iterator[np.ndarray] | None = None

    def _sequence_iter(self) -> Iterator[np.ndarray]:
        buf = np.zeros(0, dtype=np.int32)
        docs: list[str] = []
        for doc in self.documents():
            docs.append(doc)
            if len(docs) == self.docs_per_chunk:
                buf = np.concatenate([buf, encode_documents(self.tokenizer, docs)])
                docs = []
                while len(buf) >= self.seq_len:
                    yield buf[: self.seq_len]
                    buf = buf[self.seq_len :]
        if docs:
            buf = np.concatenate([buf, encode_documents(self.tokenizer, docs)])
        while len(buf) >= self.seq_len:
            yield buf[: self.seq_len]
            buf = buf[self.seq_len :]

    def _start(self) -> None:
        self._it = self._sequence_iter()
        for _ in range(self.sequences):
            next(self._it)

    def next_batch(self) -> torch.Tensor:
        """The next global batch, shape [batch_size, seq_len], int64."""
        if self._it is None:
            self._start()
        rows: list[np.ndarray] = []
        while len(rows) < self.batch_size:
            try:
                rows.append(next(self._it))
                self.sequences += 1
            except StopIteration:
                if self.sequences == 0 and not rows:
                    raise DataError("empty corpus: the document stream yielded no full sequence") from None
                self.epoch, self.sequences, rows = self.epoch + 1, 0, []
                self._it = self._sequence_iter()
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    def state_dict(self) -> dict:
        return {"kind": "streaming", "epoch": self.epoch, "sequences": self.sequences}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != "streaming":
            raise DataError(f"data position {state} does not belong to a streaming source")
        self.epoch, self.sequences = int(state["epoch"]), int(state["sequences"])
        self._it = None


def document_offsets(rows: torch.Tensor, sep_id: int) -> torch.Tensor:
    """Document boundaries of packed rows ``[B, L]`` (documents end with the separator ``sep_id``, and every row
    starts a new one): ``cu_seqlens [N + 1]`` int32 of the flattened row ``[1, B*L]`` (``ops/common/varlen.py``).
    A document cut by a row end continues in no other row: its two parts are two documents."""
    b, seq_len = rows.shape
    flat = rows.reshape(-1)
    ends = (flat == sep_id).nonzero()[:, 0] + 1  # a document ends after its separator
    row_starts = torch.arange(0, b * seq_len + 1, seq_len, device=rows.device)
    return torch.unique(torch.cat([row_starts, ends])).to(torch.int32)  # sorted, duplicates merged


def varlen_inputs(rows: torch.Tensor, sep_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``data.pack: varlen`` inputs of a batch of packed rows ``[B, L]``: (input_ids ``[1, B*L]``, labels
    ``[1, B*L]`` with -100 at each row start except the first, so that no row predicts the next one's first token
    (the same targets as the ``[B, L]`` batch), cu_seqlens ``[N + 1]`` from ``document_offsets``)."""
    b, seq_len = rows.shape
    labels = rows.clone()
    labels[1:, 0] = -100
    return rows.reshape(1, -1), labels.reshape(1, -1), document_offsets(rows, sep_id)


def local_slice(batch: torch.Tensor, grad_accum: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's micro-batches of a global batch: [grad_accum*world*micro, L] -> [grad_accum, micro, L].

    The global batch is read as ``[grad_accum, world_size, micro, L]``, so one process with ``grad_accum=k`` sees the
    same sequences per optimizer step as ``k`` processes with ``grad_accum=1``.
    """
    g, seq_len = batch.shape
    if g % (grad_accum * world_size):
        raise ValueError(f"global batch {g} is not divisible by grad_accum*world_size={grad_accum * world_size}")
    return batch.view(grad_accum, world_size, g // (grad_accum * world_size), seq_len)[:, rank]
