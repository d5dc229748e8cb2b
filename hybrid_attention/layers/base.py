"""The token-mixer contract shared by every layer (`TokenMixer`, docs/DESIGN.md) and the helpers its implementations
share. The one idea: a static `step` equals the eager one-token decode on the same state and never syncs with the
host, so a whole-model step traces into one graph and captures into a CUDA graph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybrid_attention.ops.common.varlen import check_cu_seqlens, document_lengths, positions_in_document


class StaticState:
    """Preallocated decode buffers of one mixer (built by `TokenMixer.init_static_state`), updated in place by `step`.

    The addresses of `buffers()` never change (CUDA graphs read and write them). Constants derived from the layer's
    weights when the state is built (e.g. discretised SSM parameters) may be kept too: the weights must not change
    while the static state is used.
    """

    def buffers(self) -> list[torch.Tensor]:
        """Every static tensor a step reads or writes."""
        raise NotImplementedError

    def small_buffers(self) -> list[torch.Tensor]:
        """The buffers a step changes irreversibly (recurrent states, counters): what a caller snapshots and restores
        around warm-up steps. Large caches are excluded: a step writes them only at the current position, which the
        next real step overwrites before anything reads it."""
        return self.buffers()

    def fill_random(self, length: int, generator: torch.Generator, softmax_fraction: float = 0.5) -> None:
        """Timing only: random contents as if `length` tokens had been seen (costs of a real context of that length,
        meaningless outputs). softmax_fraction: the kept fraction of complete chunks (NAtS-L; ignored otherwise)."""
        raise NotImplementedError

    def row(self, b: int) -> StaticState:
        """A view of row b (batch 1, sharing the storage): what `load_static_state` of a mixer without
        ``packed_states`` fills from the row's own batch-1 prefill state (``models/padding.RowStates``)."""
        raise NotImplementedError(f"{type(self).__name__} has no per-row view")

    def overflowed(self) -> torch.Tensor | None:
        """A 0-d bool device tensor when the buffers can overflow (NAtS-L kept more chunks than its capacity; outputs
        then not valid), else None. Reading its value is a host sync: do it outside the step."""
        return None


class TokenMixer(nn.Module):
    """Base class of the token mixers: documents the contract and holds no parameters.

    packed_states: whether a packed call (``cu_seqlens``, from an empty state) returns a state with
    ``output_state=True``: the ordinary batched decode state whose row i continues document i (the prefill of a
    left-padded batch, ``models/padding.py``). Mixers without it refuse ``output_state`` with ``cu_seqlens``.

    Training, prefill and eager (Python-side state) decoding:

        y, state = layer(x, state=None)              # x: [B, T, hidden]
        state = layer.init_state(batch_size, device=..., dtype=...)
        n = layer.state_size(seq_len)                # real numbers kept per sequence after seq_len tokens

    `state=None` runs a stateless pass (training) and returns `(y, None)` unless `output_state=True`. Passing a state
    (e.g. from `init_state`) continues from it and returns the updated state; the state object is not modified in place,
    so a caller can keep an old state to branch from it. Prefill then one-token decoding, or feeding a sequence in
    arbitrary pieces, reproduces the full forward pass.

    Static decoding (serving: `StaticDecoder` captures a whole-model step in a CUDA graph, optionally compiled):

        static = layer.init_static_state(batch_size, max_len, device, dtype)   # preallocated buffers (a StaticState)
        layer.load_static_state(static, state)       # copy an eager (prefill) state of at most max_len tokens into them
        y_t = layer.step(x_t, static, pos)           # x_t, y_t: [B, 1, hidden]; pos: long device tensor, 0-d or [B]

    `step` reads and updates only the buffers of `static`, in place, and equals the eager one-token decode
    `layer(x_t, state)` on the same state. It is gpt-fast shaped: no host sync (`.item()`, `.tolist()`, `nonzero`, ...),
    no shape that depends on a tensor value and no Python branch on one, so it traces into one graph
    (`torch.compile(fullgraph=True)`) and captures into a CUDA graph. Positions are device tensors; RoPE reads them
    through `RotaryEmbedding.at` (`rope_positions`). A step may branch on `pos.dim()` (a shape, fixed per graph):

    - pos 0-d: every row at the same position (equal-length prompts).
    - pos [B]: per-row positions (prompts of different lengths, after a left-padded prefill: row b holds its own
      document from position 0, ``models/padding.py``). Static layout per row: softmax K/V of row b's position p in slot
      p (the valid keys of row b: 0..pos[b]); recurrent states are per row anyway; NAtS-L's chunk slot is pos[b] mod C.
      `load_static_state` then takes the packed prefill's state (``KVState.pad``: right-aligned rows are moved to slot
      0) or, for a mixer without ``packed_states`` (NAtS-L), one batch-1 state per row through ``StaticState.row(b)``.

    DECISION (chunk ends, named once here): a mixer whose step does extra work at the end of each chunk of C tokens
    (NAtS-L: type the chunk, commit or roll back its GDN writes, keep or drop its K/V) declares C through
    `step_chunk_size()`, and its `step` takes the host-known flag `chunk_end`. With a 0-d pos, chunk_end = "this token
    completes a chunk" = (position + 1) % C == 0: the caller knows every position on the host (it chooses a CUDA graph
    per pattern of flags), so the step never computes the chunk-end work and masks it out, and never branches on the
    device position. With per-row positions ([B]) rows complete chunks at different steps; chunk_end then means "at
    least one row may complete a chunk here" (the host knows every row's length): the step computes the chunk-end work
    for every row and applies it under the device-side per-row mask (pos[b] + 1) % C == 0; chunk_end=False promises that
    no row completes one. So there are still two graphs per chunk size (inside-chunk, chunk-final), and the cost of the
    per-row design is that a chunk-final step does the chunk-end work of all B rows (routing, the S select, the K/V copy
    of the chunk) to use it for some: with rows at distinct phases up to min(B, C) of every C steps are chunk-final
    instead of one. Mixers without chunks return None and ignore the flag.
    """

    packed_states: bool = False

    def init_state(self, batch_size: int, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> Any:
        """The state of an empty prefix (the mixer's own state type)."""
        raise NotImplementedError

    def state_size(self, seq_len: int) -> int:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, state: Any = None, *, output_state: bool | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, Any | None]:
        """x [B, T, hidden] -> (y [B, T, hidden], state or None). cu_seqlens [N + 1]: packed documents in one row
        (B == 1), nothing crosses a boundary (``packed_positions``)."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------------------- static
    def init_static_state(self, batch_size: int, max_len: int, device: torch.device | str | None = None,
                          dtype: torch.dtype | None = None, *, use_kernels: bool | None = None,
                          cache_chunks: int | None = None) -> StaticState:
        """Preallocated buffers for decoding up to `max_len` tokens (prompt included) of `batch_size` rows, zero (the
        state of an empty prefix). device / dtype: the model's. use_kernels: the fused Triton decode steps (default:
        on CUDA), used where the state dtype allows. cache_chunks: capacity of a compacted chunk cache in chunks per
        (row, head) (NAtS-L; default: every chunk of max_len; ignored by other mixers)."""
        raise NotImplementedError(f"{type(self).__name__} has no static decode step")

    def load_static_state(self, static: StaticState, state: Any) -> None:
        """Copy the eager state `state` (from `forward(..., output_state=True)`, e.g. a prefill) into `static`."""
        raise NotImplementedError(f"{type(self).__name__} has no static decode step")

    def step(self, x: torch.Tensor, static: StaticState, pos: torch.Tensor, chunk_end: bool = False) -> torch.Tensor:
        """One token: x [B, 1, hidden] at position pos (long device tensor: 0-d, one position for all rows, or [B],
        per row) -> y [B, 1, hidden]; `static` is advanced in place. chunk_end: the host-known chunk-end flag (module
        docstring; ignored without chunks)."""
        raise NotImplementedError(f"{type(self).__name__} has no static decode step")

    def step_chunk_size(self) -> int | None:
        """C when `step` does extra work on every C-th token (it then needs `chunk_end`), else None."""
        return None


def has_static_step(mixer: type[TokenMixer] | TokenMixer) -> bool:
    """Whether a mixer (class or instance) implements the static-decode part of the contract."""
    cls = mixer if isinstance(mixer, type) else type(mixer)
    return cls.step is not TokenMixer.step


def check_hidden(x: torch.Tensor, hidden_size: int) -> None:
    if x.dim() != 3 or x.shape[-1] != hidden_size:
        raise ValueError(f"x must be [B, T, {hidden_size}], got shape {tuple(x.shape)}")


def packed_positions(x: torch.Tensor, state: Any, keep: bool, cu_seqlens: torch.Tensor, name: str,
                     packed_states: bool = False) -> torch.Tensor:
    """Check a packed call (x [1, T, hidden] of documents at the offsets ``cu_seqlens [N + 1]``, see
    ``ops/common/varlen.py``) and return each token's position in its document ``[T]`` (RoPE restarts at 0).

    DECISION: packed documents run from an empty state; a state with ``cu_seqlens`` raises ``ValueError`` naming the
    layer, and so does ``output_state`` unless the layer returns per-document states (``packed_states``).
    """
    check_cu_seqlens(cu_seqlens, x.shape[1], x.shape[0])  # in full for CPU offsets; no host read of device ones
    if state is not None or (keep and not packed_states):
        raise ValueError(f"{name}: cu_seqlens runs packed documents from an empty state; state / output_state "
                         f"are not supported with it")
    return positions_in_document(cu_seqlens, x.shape[1])


def left_pad(cu_seqlens: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Rows of the documents of ``cu_seqlens [N + 1]`` as a left-padded batch: (width L = the longest document,
    pad [N] (int64) = L - the length of each), the per-row positions a packed prefill's state keeps."""
    lens = document_lengths(cu_seqlens)
    width = int(lens.max())
    return width, width - lens


def right_align(z: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Packed z [1, T, ...] -> [N, L, ...]: document i in the last of its row's L slots (``left_pad``), zeros
    before it."""
    width, pad = left_pad(cu_seqlens)
    valid = torch.arange(width, device=z.device)[None, :] >= pad[:, None]
    out = z.new_zeros(pad.numel(), width, *z.shape[2:])
    out[valid] = z[0]
    return out


def row_positions(offset: int, pad: torch.Tensor | None, t: int, device: torch.device) -> torch.Tensor | None:
    """Positions [B, t] of the next t tokens of rows that hold ``offset`` slots, the first ``pad [B]`` of them
    padding (None when pad is None: every row at offset..offset+t-1)."""
    if pad is None:
        return None
    return offset - pad[:, None] + torch.arange(t, device=device)[None, :]


def rope_positions(pos: torch.Tensor) -> torch.Tensor:
    """A step's positions as `RotaryEmbedding.at` takes them for x [B, 1, H, D]: 0-d stays 0-d (one position for all
    rows), [B] becomes [B, 1] (one position per row)."""
    return pos if pos.dim() == 0 else pos[:, None]


@torch.no_grad()
def copy_conv_states(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    """Copy ShortConvolution states [B, channels, K-1] by branch name into the static buffers `dst` (in place; no
    autograd history: static buffers are inference state, and may be views of one buffer, e.g. GDN's q|k|v)."""
    for name, new in src.items():
        dst[name].copy_(new)
