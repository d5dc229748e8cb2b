"""``help()`` of every public layer names its constructor arguments; module docstrings stay short."""

import ast
import inspect
import pydoc
import re
from pathlib import Path

import pytest
from torch import nn

import hybrid_attention
import hybrid_attention.layers as layers
from hybrid_attention.integrations import fla

PACKAGE = Path(hybrid_attention.__file__).resolve().parent

# The longest module docstring allowed, in characters: 1-5 lines saying what the file holds and why. The method,
# decisions and measurements live in the class / function docstrings, at the code as comments, or in docs/DESIGN.md.
MODULE_DOC_LIMIT = 600
# The whole package's module docstrings together, in characters (they sum to about 41K).
PACKAGE_DOC_LIMIT = 50_000
# Modules exempt from MODULE_DOC_LIMIT (none: every module is within it). The list only shrinks: a listed module that
# is within the limit (or gone) fails test_exemptions_are_current.
EXEMPT: set[str] = set()


def _public_modules() -> list[type[nn.Module]]:
    found = {}
    for namespace in (layers, hybrid_attention, fla):
        for name in getattr(namespace, "__all__", dir(namespace)):
            obj = getattr(namespace, name)
            if inspect.isclass(obj) and issubclass(obj, nn.Module) and not name.startswith("_"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[key] for key in sorted(found)]


def _constructor_arguments(cls: type) -> list[str]:
    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _docstring_text(cls: type) -> str:
    """The docstring part of ``pydoc.render_doc(cls)``: the class docstring and the ``__init__`` docstring."""
    rendered = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    parts = [inspect.getdoc(cls) or ""]
    if cls.__init__ is not nn.Module.__init__ and cls.__init__.__doc__:  # help() shows an inherited __init__ too
        parts.append(inspect.getdoc(cls.__init__) or "")
    # Both parts are what help() shows; checking they are in the rendered page keeps the test honest about help().
    for part in parts:
        first = part.strip().splitlines()[0] if part.strip() else ""
        assert first in rendered
    return "\n".join(parts)


PUBLIC = _public_modules()


def test_public_layers_found() -> None:
    names = {cls.__name__ for cls in PUBLIC}
    assert {"InterdomainAttention", "NatsLAttention", "SoftmaxAttention", "GatedDeltaNet", "S4DMixer",
            "HybridForCausalLM"} <= names
    assert any(cls.__module__ == fla.__name__ for cls in PUBLIC)


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}")
def test_help_names_every_constructor_argument(cls: type) -> None:
    text = _docstring_text(cls)
    missing = [name for name in _constructor_arguments(cls) if not re.search(rf"\b{name}\b", text)]
    assert not missing, f"{cls.__qualname__}: help() does not name {missing}"


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _module_doc(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("path", [p for p in _modules() if _name(p) not in EXEMPT], ids=_name)
def test_module_docstring_is_short(path: Path) -> None:
    doc = _module_doc(path)
    assert len(doc) <= MODULE_DOC_LIMIT, f"{_name(path)}: module docstring has {len(doc)} characters"


def test_exemptions_are_current() -> None:
    lengths = {_name(p): len(_module_doc(p)) for p in _modules()}
    stale = sorted(name for name in EXEMPT if lengths.get(name, 0) <= MODULE_DOC_LIMIT)
    assert not stale, f"remove from EXEMPT (within the limit or gone): {stale}"


def test_package_module_docstrings_total() -> None:
    total = sum(len(_module_doc(p)) for p in _modules())
    assert total <= PACKAGE_DOC_LIMIT, f"module docstrings total {total} characters"
