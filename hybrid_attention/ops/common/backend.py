"""The one backend dispatcher of every op: "reference" | "triton" | "auto" (plus an op's extra names) decided once.

Each public op (``ops/<op>/__init__.py``) calls ``resolve_backend`` with its allowed names and whether its Triton
kernels would run these inputs, then runs the form the returned name stands for. The error message for an unknown
name is built here, from the op's allowed list, so that every op words it the same way.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["DEFAULT_BACKENDS", "resolve_backend"]

DEFAULT_BACKENDS: tuple[str, ...] = ("reference", "triton", "auto")


def resolve_backend(
    name: str,
    op: str,
    supported: bool | Callable[[], bool],
    allowed: tuple[str, ...] = DEFAULT_BACKENDS,
    *,
    varlen: bool = False,
    no_varlen: tuple[str, ...] = ("triton",),
    fast: str = "triton",
) -> str:
    """The backend an op runs: ``name`` itself, except ``"auto"`` -> ``fast`` (the op's accelerated form: "triton"
    unless the op names another, e.g. "flash") when ``supported`` else ``"reference"``.

    ``op`` names the op in the error message. ``supported`` is the op's own rule for "auto" (typically: triton
    imports, CUDA inputs, and the kernels handle these dtypes and shapes); a callable is called only for "auto", so
    that its shape checks never run before the op's own input validation. ``allowed`` lists every name the op
    accepts, its extra forms too (e.g. ``"naive"``, ``"fft"``, ``"flex"``). An unknown name raises ``ValueError``
    ``"<op>: backend must be one of 'a', 'b', got 'x'"``.

    ``varlen``: the call has ``cu_seqlens`` (packed documents, ``ops/common/varlen.py``). The backends in
    ``no_varlen`` do not take it yet: "auto" then resolves to "reference" when ``fast`` is one of them (else by
    ``supported`` as usual), and naming one of them raises ``NotImplementedError`` ``"cu_seqlens is not supported
    by the <name> backend of <op> yet; use backend='reference'"``. Ops whose Triton kernels take packed documents
    (gated_delta, chunk_attention, natsl_mixed, interdomain, s4d_bilinear) pass a ``no_varlen`` without "triton".
    """
    if name not in allowed:
        raise ValueError(f"{op}: backend must be one of {', '.join(repr(a) for a in allowed)}, got {name!r}")
    if varlen and name == "auto" and fast in no_varlen:
        return "reference"
    if varlen and name in no_varlen:
        raise NotImplementedError(
            f"cu_seqlens is not supported by the {name} backend of {op} yet; use backend='reference'"
        )
    if name == "auto":
        ok = supported() if callable(supported) else supported
        return fast if ok else "reference"
    return name
