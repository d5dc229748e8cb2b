"""The one backend dispatcher (``ops/common/backend.py``) and the common face of every op's ``triton/`` package."""

from __future__ import annotations

import importlib

import pytest

from hybrid_attention.ops.common.backend import resolve_backend, resolve_use_kernels, validate_backend


def test_resolve_backend_auto_and_names():
    assert resolve_backend("auto", "op", True) == "triton"
    assert resolve_backend("auto", "op", False) == "reference"
    assert resolve_backend("auto", "op", lambda: True) == "triton"
    assert resolve_backend("naive", "op", True, ("auto", "naive")) == "naive"
    calls = []
    assert resolve_backend("reference", "op", lambda: calls.append(1) or True) == "reference"
    assert calls == []  # the support rule runs only for "auto"


def test_resolve_backend_error_lists_the_allowed_names():
    with pytest.raises(ValueError, match="myop: backend must be one of 'auto', 'naive', got 'x'"):
        resolve_backend("x", "myop", True, ("auto", "naive"))


def test_validate_backend_is_the_one_message():
    validate_backend("flash", "myop", ("auto", "flash"))
    with pytest.raises(ValueError, match="^myop: backend must be one of 'auto', 'flash', got 'x'$"):
        validate_backend("x", "myop", ("auto", "flash"))


def test_resolve_backend_fast_callable_runs_only_for_auto():
    calls = []
    pick = lambda: calls.append(1) or "toeplitz"  # noqa: E731
    assert resolve_backend("fft", "op", True, ("auto", "fft", "toeplitz"), fast=pick) == "fft"
    assert calls == []
    assert resolve_backend("auto", "op", True, ("auto", "fft", "toeplitz"), fast=pick) == "toeplitz"
    assert resolve_backend("auto", "op", False, ("auto", "fft", "toeplitz"), fast=pick) == "reference"
    assert calls == [1]


def test_use_kernels_flag_is_a_backend_choice():
    assert resolve_use_kernels(None, "op", True) and not resolve_use_kernels(None, "op", False)
    assert resolve_use_kernels(True, "op", False)  # true forces the kernels (the interpreter on the CPU)
    assert not resolve_use_kernels(False, "op", True)


@pytest.mark.parametrize("op", ["interdomain", "s4d_bilinear", "gated_delta", "chunk_attention", "natsl_mixed",
                                "decode_attention", "decode_linear", "causal_conv"])
def test_every_triton_package_has_the_same_face(op):
    pkg = importlib.import_module(f"hybrid_attention.ops.{op}.triton")
    assert isinstance(pkg.HAS_TRITON, bool) and callable(pkg.supported)
    assert {"HAS_TRITON", "supported"} <= set(pkg.__all__)
