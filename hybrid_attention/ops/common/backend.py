"""The one backend dispatcher of every op: "reference" | "triton" | "auto" (plus an op's extra names), decided once by
``resolve_backend`` from the op's allowed names and whether its Triton kernels run these inputs; ``validate_backend``
words every unknown-name error the same way, and the decode steps' ``use_kernels`` flags map onto backend names."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["DEFAULT_BACKENDS", "flag_backend", "resolve_backend", "resolve_use_kernels", "validate_backend"]

DEFAULT_BACKENDS: tuple[str, ...] = ("reference", "triton", "auto")


def validate_backend(name: str, op: str, allowed: tuple[str, ...] = DEFAULT_BACKENDS) -> None:
    """Raise ``ValueError`` ``"<op>: backend must be one of 'a', 'b', got 'x'"`` unless ``name`` is in ``allowed``."""
    if name not in allowed:
        raise ValueError(f"{op}: backend must be one of {', '.join(repr(a) for a in allowed)}, got {name!r}")


def flag_backend(use_kernels: bool | None) -> str:
    """The backend name a public ``use_kernels`` flag stands for: None -> "auto", true -> "triton", false ->
    "reference". Its caller passes it to ``resolve_backend`` with the rule that decides "auto"."""
    if use_kernels is None:
        return "auto"
    return "triton" if use_kernels else "reference"


def resolve_backend(
    name: str,
    op: str,
    supported: bool | Callable[[], bool],
    allowed: tuple[str, ...] = DEFAULT_BACKENDS,
    *,
    varlen: bool = False,
    no_varlen: tuple[str, ...] = ("triton",),
    fast: str | Callable[[], str] = "triton",
) -> str:
    """The backend an op runs: ``name`` itself, except ``"auto"`` -> ``fast`` (the op's accelerated form: "triton"
    unless the op names another, e.g. "flash") when ``supported`` else ``"reference"``.

    ``op`` names the op in the error message. ``supported`` is the op's own rule for "auto" (typically: triton
    imports, CUDA inputs, and the kernels handle these dtypes and shapes); a callable is called only for "auto", so
    that its shape checks never run before the op's own input validation. ``fast`` may be a callable returning the
    form, for an op whose "auto" picks among several forms by its inputs (``s4d``: Toeplitz, FFT or chunked); it is
    called only for "auto" and when ``supported``, after the name is validated. ``allowed`` lists every name the op
    accepts, its extra forms too (e.g. ``"naive"``, ``"fft"``, ``"flex"``). An unknown name raises ``ValueError``
    ``"<op>: backend must be one of 'a', 'b', got 'x'"``.

    ``varlen``: the call has ``cu_seqlens`` (packed documents, ``ops/common/varlen.py``). The backends in
    ``no_varlen`` do not take it yet: "auto" then resolves to "reference" when ``fast`` is one of them (else by
    ``supported`` as usual), and naming one of them raises ``NotImplementedError`` ``"cu_seqlens is not supported
    by the <name> backend of <op> yet; use backend='reference'"``. Ops whose Triton kernels take packed documents
    (gated_delta, chunk_attention, natsl_mixed, interdomain, s4d_bilinear) pass a ``no_varlen`` without "triton".
    """
    validate_backend(name, op, allowed)
    if varlen and name == "auto" and fast in no_varlen:
        return "reference"
    if varlen and name in no_varlen:
        raise NotImplementedError(
            f"cu_seqlens is not supported by the {name} backend of {op} yet; use backend='reference'"
        )
    if name == "auto":
        ok = supported() if callable(supported) else supported
        if not ok:
            return "reference"
        return fast() if callable(fast) else fast
    return name


def resolve_use_kernels(use_kernels: bool | None, op: str, supported: bool | Callable[[], bool]) -> bool:
    """Whether a decode step runs its Triton kernels, from a public ``use_kernels`` flag: ``flag_backend`` then
    ``resolve_backend``, so None decides as "auto" does (by ``supported``, typically: CUDA inputs) and true / false
    force the kernels on / off (true runs them on the CPU under the interpreter)."""
    return resolve_backend(flag_backend(use_kernels), op, supported) == "triton"
