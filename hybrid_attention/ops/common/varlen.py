"""Variable-length (packed) sequences, fla's ``cu_seqlens`` convention for every op and layer: N non-empty documents
concatenated in one row ``x [1, T, ...]``, ``cu_seqlens [N + 1]`` (int32 / int64) their offsets from 0 to T. Nothing
crosses a document boundary: states, convolutions, RoPE positions and chunks restart at each document start (per-chunk
inputs ``[1, Nc, ...]``, Nc = Σ_i ceil(len_i / chunk_size)); initial / final states are per document, ``[N, ...]``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

__all__ = [
    "validate_cu_seqlens",
    "cu_seqlens_from_lengths",
    "document_lengths",
    "document_ids",
    "positions_in_document",
    "chunk_offsets",
    "chunk_layout",
    "per_document",
    "varlen_kwargs",
    "validate_packed",
    "ChunkTable",
    "max_chunks",
    "min_chunks",
    "chunk_table",
    "check_cu_seqlens",
    "check_packed",
    "check_initial_state",
]


def _check_form(cu_seqlens: torch.Tensor, batch_size: int, name: str) -> None:
    """The checks that read no offset value: type, dtype, shape and the batch size of the inputs."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"{name} must be a 1-d int32 or int64 tensor of offsets, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must have dtype int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must be a 1-d tensor [N + 1] with N >= 1, got shape {tuple(cu_seqlens.shape)}")
    if batch_size != 1:
        raise ValueError(f"{name} requires inputs of batch size 1 (documents packed along T), got B = {batch_size}")


def validate_cu_seqlens(
    cu_seqlens: torch.Tensor, total_len: int, batch_size: int = 1, name: str = "cu_seqlens"
) -> list[int]:
    """Check ``cu_seqlens`` against inputs of ``batch_size`` rows and ``total_len`` tokens; return the offsets as a
    host list ``[N + 1]``. Raises ``ValueError`` with one line naming the argument.

    dtype: int32 (fla's) or int64 (what ``torch.cumsum`` returns) are both accepted; any other dtype is an error.
    Documents are non-empty: the offsets must be strictly increasing (an empty document has no final token, so no
    final state worth reporting; packers never produce one).
    """
    _check_form(cu_seqlens, batch_size, name)
    offs = [int(o) for o in cu_seqlens.tolist()]
    if offs[0] != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0] = {offs[0]}")
    bad = next((i for i in range(1, len(offs)) if offs[i] <= offs[i - 1]), None)
    if bad is not None:
        raise ValueError(
            f"{name} must be strictly increasing (no empty document), got {name}[{bad - 1}] = {offs[bad - 1]} "
            f">= {name}[{bad}] = {offs[bad]}"
        )
    if offs[-1] != total_len:
        raise ValueError(f"{name} must end at T = {total_len} (the packed length), got {name}[-1] = {offs[-1]}")
    return offs


def cu_seqlens_from_lengths(lengths: Sequence[int] | torch.Tensor, device: torch.device | str | None = None
                            ) -> torch.Tensor:
    """Offsets ``[N + 1]`` int32 of documents of the given lengths ``[N]``."""
    lens = torch.as_tensor(lengths, dtype=torch.int64, device=device)
    return torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(torch.int32)


def document_lengths(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Lengths ``[N]`` (int64) of the documents of ``cu_seqlens [N + 1]``."""
    return (cu_seqlens[1:] - cu_seqlens[:-1]).long()


def bucket_of(offsets: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Index i (int64, shape of ``pos``) with ``offsets[i] <= pos < offsets[i + 1]`` for sorted ``offsets [N + 1]``
    starting at 0 and ``pos >= 0``: ``searchsorted`` over the *whole* offsets, minus 1. Never over a slice such as
    ``offsets[1:]``: inductor in torch 2.11 cannot lower ``searchsorted`` whose sorted sequence is a view
    (``NotImplementedError: SliceView`` from ``get_stride``; torch 2.13 realizes it first)."""
    return torch.searchsorted(offsets, pos.to(offsets.dtype), right=True) - 1


def document_ids(cu_seqlens: torch.Tensor, total_len: int | None = None) -> torch.Tensor:
    """Document index ``[T]`` (int64) of every packed position. ``total_len`` = T when the caller knows it (the
    inputs' length): then no host read of the offsets (``searchsorted`` on the device, a static output shape)."""
    T = int(cu_seqlens[-1]) if total_len is None else total_len
    return bucket_of(cu_seqlens, torch.arange(T, device=cu_seqlens.device))


def positions_in_document(cu_seqlens: torch.Tensor, total_len: int | None = None) -> torch.Tensor:
    """Position ``[T]`` (int64) of every packed token inside its own document (0 at each document start): the RoPE
    positions and the convolution masks of packed inputs. ``total_len``: as in ``document_ids`` (no host read)."""
    doc = document_ids(cu_seqlens, total_len)
    return torch.arange(doc.numel(), device=cu_seqlens.device) - cu_seqlens[:-1].long()[doc]


def chunk_offsets(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Chunk offsets ``[N + 1]`` (int64): document i owns chunks ``[off[i], off[i + 1])`` of the per-chunk inputs,
    ``ceil(len_i / chunk_size)`` of them (chunks restart at each document start)."""
    n = (document_lengths(cu_seqlens) + chunk_size - 1) // chunk_size
    return torch.cat([n.new_zeros(1), n.cumsum(0)])


def chunk_layout(cu_seqlens: torch.Tensor, chunk_size: int, total_len: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunk starts per document: ``(starts [R], lengths [R])`` (int64), the packed position of each chunk's first
    token and its token count (``chunk_size``, or less for the last chunk of a document), in document order.

    ``total_len`` None: R = Nc, the exact chunk count (a data-dependent shape: one host read of device offsets).
    ``total_len`` = T (the inputs' length): R = ``max_chunks(T, N, chunk_size)`` rows, built with device ops only
    (``searchsorted``, as ``chunk_table``; no host read): rows ``[0, Nc)`` are the chunks, the spare rows after them
    have length 0 (their start lies past the last document's end)."""
    if total_len is None:
        lens = document_lengths(cu_seqlens)
        offs = chunk_offsets(cu_seqlens, chunk_size)
        doc = torch.repeat_interleave(torch.arange(lens.numel(), device=cu_seqlens.device), offs[1:] - offs[:-1])
        local = torch.arange(doc.numel(), device=cu_seqlens.device) - offs[:-1][doc]  # chunk number in its document
        starts = cu_seqlens[:-1].long()[doc] + local * chunk_size
        return starts, torch.minimum(lens[doc] - local * chunk_size, torch.full_like(starts, chunk_size))
    cu = cu_seqlens.long()
    n_docs = cu.numel() - 1
    offs = chunk_offsets(cu_seqlens, chunk_size)
    rows = torch.arange(max_chunks(total_len, n_docs, chunk_size), device=cu.device)
    doc = bucket_of(offs, rows).clamp_(max=n_docs - 1)
    starts = cu[doc] + (rows - offs[doc]) * chunk_size
    return starts, (cu[doc + 1] - starts).clamp(0, chunk_size)


class ChunkTable(NamedTuple):
    """What the varlen Triton kernels read (all int32, on the inputs' device): ``cu`` the token offsets ``[N + 1]``;
    ``offsets`` the chunk offsets ``[N + 1]`` (document i owns chunk rows ``[offsets[i], offsets[i + 1])``);
    ``indices [NT, 2]`` one row (document, chunk index inside the document) per chunk row, ``NT = max_chunks(...)``
    rows, those past ``offsets[N]`` empty (document N - 1, a chunk index past its end); ``chunk_size`` the chunk
    length the table was built for.

    Every Triton kernel that takes the offsets (gated delta, chunk attention, and through them NAtS-L mixed; the
    complex diagonal-SSM ones: Interdomain, bilinear S4D and the state scans they share, ``ops/common/triton/
    ssm_scan*.py``) reads one table design, the ``ChunkTable``, from one builder, ``chunk_table``: the offsets as
    int32, the per-document chunk offsets and a per-chunk-row index table (document, chunk in the document), built
    with device ops (``searchsorted``) and no host sync. Its row count is the static upper bound
    ``max_chunks(T, N, chunk_size)`` (at most N - 1 above the true Nc), so no grid or buffer shape depends on the
    offsets' values (no sync; ``torch.compile`` and CUDA graphs see static shapes). Rows ``[0, Nc)`` are the real
    chunks in document order, so row c *is* global chunk c and indexes the ``[1, Nc, ...]`` per-chunk inputs
    directly; the rows after them are empty (they point past their document's end): a kernel reads and writes
    nothing for them (``ops/common/triton/chunk_rows.py``, ``table_row``), so they add nothing to any gradient.
    The host checks need no sync either (``check_cu_seqlens``, ``check_packed``): a CPU ``cu_seqlens`` is checked in
    full (its values are already on the host) and the per-chunk inputs for the exact Nc; a device one for dtype and
    shape only (its values are trusted, as fla does: wrong device offsets are undefined behaviour) and the per-chunk
    inputs for Nc within the bounds every split of T tokens into N documents allows (``min_chunks``, ``max_chunks``;
    the kernels read per-chunk inputs masked by their own row count). No other index table exists.
    """

    cu: torch.Tensor
    offsets: torch.Tensor
    indices: torch.Tensor
    chunk_size: int

    @property
    def n_docs(self) -> int:
        """N, the number of documents."""
        return self.cu.numel() - 1

    @property
    def n_rows(self) -> int:
        """NT, the number of chunk rows (the chunk-parallel grids and the chunk-state buffers)."""
        return self.indices.shape[0]


def max_chunks(total_len: int, n_docs: int, chunk_size: int) -> int:
    """Upper bound on Σ_i ceil(len_i / chunk_size) over every split of ``total_len`` tokens into ``n_docs`` non-empty
    documents: ceil(l / L) = floor((l - 1) / L) + 1 and Σ floor(a_i) <= floor(Σ a_i) give floor((T - N) / L) + N.
    Reached (e.g. N - 1 documents of one token and one of the rest) and at most N - 1 rows above the true count."""
    return (total_len - n_docs) // chunk_size + n_docs


def min_chunks(total_len: int, n_docs: int, chunk_size: int) -> int:
    """Lower bound on Σ_i ceil(len_i / chunk_size) over every split of ``total_len`` tokens into ``n_docs`` non-empty
    documents: each document has a chunk (N) and Σ ceil(a_i) >= ceil(Σ a_i) (ceil(T / L)). Reached: documents made of
    whole chunks when N <= ceil(T / L), else N documents of at most L tokens each (T <= (N - 1)·L)."""
    return max(n_docs, -(-total_len // chunk_size))


def check_cu_seqlens(cu_seqlens: torch.Tensor, total_len: int, batch_size: int = 1, name: str = "cu_seqlens") -> int:
    """The checks of ``validate_cu_seqlens`` that need no host sync: for a CPU tensor all of them (its values are
    already on the host); for a device tensor dtype, shape and batch size only (its values are trusted, as fla does:
    reading them would stall the stream once per call). While torch.compile traces, a CPU tensor gets the device
    checks too (reading its values there is a graph break: ``fullgraph=True`` refuses it). Returns N. Raises
    ``ValueError`` naming the argument."""
    if (isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device.type == "cpu"
            and not torch.compiler.is_compiling()):
        return len(validate_cu_seqlens(cu_seqlens, total_len, batch_size, name)) - 1
    _check_form(cu_seqlens, batch_size, name)
    if cu_seqlens.numel() - 1 > total_len:
        raise ValueError(f"{name} holds N = {cu_seqlens.numel() - 1} documents, more than the T = {total_len} tokens")
    return cu_seqlens.numel() - 1


def chunk_table(cu_seqlens: torch.Tensor, total_len: int, chunk_size: int,
                device: torch.device | str | None = None) -> ChunkTable:
    """The ``ChunkTable`` of ``cu_seqlens [N + 1]`` (already checked) for chunks of ``chunk_size`` tokens, on
    ``device`` (default: the offsets' own). Device ops only, no host sync: the row count is ``max_chunks(T, N, L)``,
    each row's document is found by ``searchsorted`` over the chunk offsets."""
    cu = cu_seqlens.to(device=device if device is not None else cu_seqlens.device, dtype=torch.int64)
    n_docs = cu.numel() - 1
    lens = cu[1:] - cu[:-1]
    offs = torch.cat([cu.new_zeros(1), ((lens + chunk_size - 1) // chunk_size).cumsum(0)])
    rows = torch.arange(max_chunks(total_len, n_docs, chunk_size), device=cu.device)
    doc = bucket_of(offs, rows).clamp_(max=n_docs - 1)
    indices = torch.stack([doc, rows - offs[doc]], dim=1)
    i32 = torch.int32
    return ChunkTable(cu.to(i32), offs.to(i32), indices.to(i32).contiguous(), chunk_size)


def varlen_kwargs(cu_seqlens: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """``{"cu_seqlens": cu_seqlens}``, or ``{}`` when None: how a public op passes the offsets to the form it runs
    (forms that do not take them are refused for packed inputs by the dispatcher first)."""
    return {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}


def check_initial_state(initial_state: torch.Tensor | None, n_docs: int) -> None:
    """With cu_seqlens the initial state holds one state per document: ``initial_state [N, ...]`` with N =
    ``n_docs`` (ValueError naming it); None passes."""
    if initial_state is not None and (initial_state.dim() < 1 or initial_state.shape[0] != n_docs):
        raise ValueError(
            f"initial_state must hold one state per sequence with cu_seqlens: [N, ...] with N = {n_docs}, "
            f"got shape {tuple(initial_state.shape)}"
        )


def _check_chunked(chunked: dict[str, torch.Tensor | None] | None, lo: int, hi: int, known: bool = False) -> None:
    """Each per-chunk input of ``chunked`` is ``[1, M, ...]`` with ``lo <= M <= hi``. ``known``: lo is the true Nc
    (host offsets) and hi the sync-free row count ``max_chunks`` (the rows past Nc are ignored); else the offsets
    were not read and [lo, hi] are the bounds ``min_chunks``, ``max_chunks``."""
    for name, x in (chunked or {}).items():
        if x is None:
            continue
        if x.dim() >= 2 and x.shape[0] == 1 and lo <= x.shape[1] <= hi:
            continue
        if known:
            nc = f"Nc = {lo} chunks, or up to max_chunks = {hi} rows (the rows past Nc are ignored)"
        else:
            nc = f"Nc in [{lo}, {hi}] chunks (the offsets are not read on the host)"
        raise ValueError(
            f"{name} must be [1, Nc, ...] with {nc} (chunks restart at each document start: "
            f"Σ ceil(len_i / chunk_size)), got shape {tuple(x.shape)}"
        )


def validate_packed(
    cu_seqlens: torch.Tensor,
    first: torch.Tensor,
    chunk_size: int | None = None,
    chunked: dict[str, torch.Tensor | None] | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[list[int], list[int] | None]:
    """The packed-input checks of the reference forms (``per_document``), which read the offsets on the host:
    ``cu_seqlens`` against ``first [B, T, ...]``, each per-chunk input of ``chunked`` against ``[1, M, ...]`` with
    ``Nc <= M <= max_chunks(T, N, L)`` (the rows past Nc are ignored), ``initial_state`` against ``[N, ...]``.
    Returns the host offsets ``[N + 1]`` and, when ``chunk_size`` is given, the host chunk offsets ``[N + 1]`` (else
    None). Raises ``ValueError`` with one line naming the argument (``first`` is named ``q`` in the message). The
    Triton forms use ``check_packed`` (no host sync) instead."""
    if not isinstance(first, torch.Tensor) or first.dim() < 2:
        raise ValueError(f"q must be a [B, T, ...] tensor, got {getattr(first, 'shape', first)}")
    offs = validate_cu_seqlens(cu_seqlens, first.shape[1], first.shape[0])
    check_initial_state(initial_state, len(offs) - 1)
    if chunk_size is None:
        return offs, None
    coffs = [0]
    for a, b in zip(offs[:-1], offs[1:], strict=True):
        coffs.append(coffs[-1] + (b - a + chunk_size - 1) // chunk_size)
    _check_chunked(chunked, coffs[-1], max_chunks(first.shape[1], len(offs) - 1, chunk_size), known=True)
    return offs, coffs


def check_packed(
    cu_seqlens: torch.Tensor,
    first: torch.Tensor,
    chunk_size: int,
    chunked: dict[str, torch.Tensor | None] | None = None,
    initial_state: torch.Tensor | None = None,
) -> int:
    """The packed-input checks of the Triton forms, without a host sync: ``cu_seqlens`` against ``first [B, T, ...]``
    (``check_cu_seqlens``: in full for a CPU tensor, dtype and shape for a device one), ``initial_state`` against
    ``[N, ...]``, and each per-chunk input of ``chunked`` against ``[1, M, ...]``: ``Nc <= M <= max_chunks(T, N, L)``
    for CPU offsets (the rows past Nc are ignored), else ``min_chunks(T, N, L) <= M <= max_chunks(T, N, L)`` (the
    kernels read per-chunk inputs masked by their own row count). Returns N. Raises ``ValueError`` with one line
    naming the argument (``first`` is named ``q``).

    Per-chunk inputs may also have the sync-free row count ``max_chunks(T, N, chunk_size)`` itself, whatever the
    offsets' device and the form (the NAtS-L layer's packed routing, which cannot know Nc without a host read): rows
    ``[0, Nc)`` are the chunks, the rows past Nc are ignored (never read by a kernel, sliced off by ``per_document``);
    their gradient is zero in the reference forms and unspecified (not written) in the Triton ones.
    Ops whose Triton kernels do not take the offsets list "triton" in ``resolve_backend(no_varlen=...)``.
    """
    if not isinstance(first, torch.Tensor) or first.dim() < 2:
        raise ValueError(f"q must be a [B, T, ...] tensor, got {getattr(first, 'shape', first)}")
    T = first.shape[1]
    n_docs = check_cu_seqlens(cu_seqlens, T, first.shape[0])
    check_initial_state(initial_state, n_docs)
    if any(x is not None for x in (chunked or {}).values()):
        hi = max_chunks(T, n_docs, chunk_size)
        if cu_seqlens.device.type == "cpu":  # values on the host already: the exact count, no sync
            _check_chunked(chunked, int(chunk_offsets(cu_seqlens, chunk_size)[-1]), hi, known=True)
        else:
            _check_chunked(chunked, min_chunks(T, n_docs, chunk_size), hi)
    return n_docs


def _cat_outputs(parts: list, kinds: str):
    """Join per-document results: kind "t" along T (dim 1), kind "n" per sequence along dim 0 (None stays None)."""
    joined = []
    for i, kind in enumerate(kinds):
        items = [p[i] for p in parts]
        if items[0] is None:
            joined.append(None)
        else:
            joined.append(torch.cat(items, dim=1 if kind == "t" else 0))
    return joined


def per_document(tokens: tuple[str, ...], chunks: tuple[str, ...] = (), outputs: str = "tn") -> Callable:
    """Decorator giving an op form a ``cu_seqlens=None`` keyword: with offsets, each document runs as its own sequence
    of batch one and the results are joined.

    tokens: the per-token arguments ``[1, T, ...]`` (sliced along T; the first one sets T); chunks: the per-chunk
    arguments ``[1, Nc, ...]`` (sliced by ``chunk_offsets`` with the form's ``chunk_size``); ``initial_state``, when
    the form takes one, is per sequence ``[N, ...]``. outputs: one letter per returned value (a single "t" = the form
    returns one tensor), "t" for ``[1, T, ...]`` outputs, "n" for per-sequence ones (final states -> ``[N, ...]``).

    The reference forms read the offsets on the host (one sync per call) and run each document as its own sequence
    (``per_document``): exact by construction, and chunks restart at each document start for free.
    """

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, cu_seqlens: torch.Tensor | None = None, **kwargs):
            if cu_seqlens is None:
                return fn(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            arg = bound.arguments
            first = arg[tokens[0]]
            if not isinstance(first, torch.Tensor) or first.dim() < 2:
                raise ValueError(f"{tokens[0]} must be a [B, T, ...] tensor, got {getattr(first, 'shape', first)}")
            init = arg.get("initial_state")
            offs, coffs = validate_packed(cu_seqlens, first, arg["chunk_size"] if chunks else None,
                                          {name: arg[name] for name in chunks}, init)
            n_docs = len(offs) - 1
            parts = []
            for i in range(n_docs):
                doc = dict(arg)
                for name in tokens:
                    if arg[name] is not None:
                        doc[name] = arg[name][:, offs[i] : offs[i + 1]]
                for name in chunks:
                    if arg[name] is not None:
                        doc[name] = arg[name][:, coffs[i] : coffs[i + 1]]
                if init is not None:
                    doc["initial_state"] = init[i : i + 1]
                out = fn(**doc)
                parts.append(out if len(outputs) > 1 else (out,))
            joined = _cat_outputs(parts, outputs)
            return tuple(joined) if len(outputs) > 1 else joined[0]

        params = list(sig.parameters.values())
        extra = inspect.Parameter("cu_seqlens", inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation="torch.Tensor | None")
        wrapper.__signature__ = sig.replace(parameters=[*params, extra])  # type: ignore[attr-defined]
        return wrapper

    return wrap
