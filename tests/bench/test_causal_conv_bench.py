"""``benchmarks/causal_conv.py``'s shape selection: ``--widths`` keeps only the named channel widths."""

from __future__ import annotations

from benchmarks.causal_conv import SHAPES, _shapes


def test_widths_select_the_fused_convolutions() -> None:
    """``--widths 2048 3072`` keeps each shape's fused q|k|v width only; a shape left without a width is dropped;
    no ``--widths`` keeps every width; the dry run keeps its tiny shape."""
    assert _shapes(False, False, [2048, 3072]) == {"small": (16, 2048, (2048,)), "340m": (4, 4096, (3072,))}
    assert _shapes(False, False, [3072]) == {"340m": (4, 4096, (3072,))}
    assert _shapes(False, False) == SHAPES[False]
    assert _shapes(False, True, [2048]) == {"small": (16, 2048, (2048,))}
    assert _shapes(True, False, [2048]) == SHAPES[True]
