"""The one reader of a ``ops.common.varlen.ChunkTable`` inside Triton kernels, ``table_row`` (imports triton: only
the kernel modules import it)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["table_row"]


@triton.jit
def table_row(cu, ci, row, C: tl.constexpr):
    """(doc, t0, t1) of chunk row ``row``: its document, first token and end token (exclusive), all int32.

    ``table_row(cu, ci, row, C)``: chunk row ``row`` of the table (``cu [N + 1]`` the token offsets, ``ci [NT, 2]`` the
    per-row (document, chunk in the document), both int32) -> ``(doc, t0, t1)``: its document and its packed token range
    ``[t0, t1)``, ``t1 = min(t0 + C, cu[doc + 1])``. A spare row (past the real chunks: the row count is the sync-free
    bound ``max_chunks``) has ``t0 >= t1``: no tokens. Every varlen kernel tests that (``t1 <= t0``) and reads and
    writes nothing for such a row.
    """
    doc = tl.load(ci + 2 * row)
    t0 = tl.load(cu + doc) + tl.load(ci + 2 * row + 1) * C
    t1 = tl.minimum(t0 + C, tl.load(cu + doc + 1))
    return doc, t0, t1
