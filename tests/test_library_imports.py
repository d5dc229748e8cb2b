"""The library does not import the repository's ``benchmarks`` package, and the wheel does not ship it."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cli_import_leaves_benchmarks_unloaded() -> None:
    code = ("import sys, hybrid_attention, hybrid_attention.cli\n"
            "print(sorted(m for m in sys.modules if m == 'benchmarks' or m.startswith('benchmarks.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_wheel_packages_exclude_benchmarks() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.packages.find]", 1)[1].split("\n[", 1)[0]
    include = re.search(r"^include\s*=\s*\[(.*?)\]", section, re.MULTILINE | re.DOTALL)
    assert include is not None, section
    assert "hybrid_attention" in include.group(1) and "benchmarks" not in include.group(1), include.group(0)
