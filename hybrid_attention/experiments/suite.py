"""The suite schema (``Suite``): a base run config, cells (config overrides) x seeds, the evaluations to run after
training; ``load_suite`` reads one from YAML."""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from hybrid_attention.config.run_config import RunConfig, check
from hybrid_attention.config.schema import ConfigError, from_dict, merge, parse_overrides, read_yaml_mapping
from hybrid_attention.training.recall import RecallConfig


@dataclass
class CellSpec:
    name: str
    label: str = ""  # longer description for the table
    overrides: dict = field(default_factory=dict)  # nested RunConfig overrides
    recall: dict = field(default_factory=dict)  # merged into every recall task of the suite
    lm: bool | None = None  # None: the suite's setting
    seeds: list[int] | None = None  # None: the suite's seeds (fewer seeds for cheap side ablations)


@dataclass
class EvalSpec:
    length_multipliers: list[float] = field(default_factory=lambda: [1.0])
    length_tokens: int = 16384  # the same token prefix of the validation split is scored at every length
    routing: bool = True  # NAtS-L softmax fraction per layer and head (mean over routing_windows windows)
    routing_windows: int = 16


@dataclass
class Suite:
    """One experiment suite, as written in YAML:

    ```yaml
    name: interdomain_vs_s4d
    description: what the suite tests
    claims: ["interdomain §5.1: Interdomain 13-16% below S4D-only"]
    out_dir: runs/experiments/interdomain_vs_s4d
    seeds: [0, 1]
    reference: softmax              # cell the "vs ref" column compares with (optional)
    base: {model: {...}, data: {...}, optim: {...}, train: {...}}    # a RunConfig (hybrid_attention.config.run_config)
    cells:
      - {name: softmax, overrides: {model: {layers: softmax}}}
      - {name: interdomain, overrides: {model: {layers: interdomain}}}
    eval: {length_multipliers: [1, 2, 3.5], length_tokens: 16384, routing: true}
    jobs: 1                         # optional: (cell, seed) runs at once (subprocesses), overridden by --jobs
    recall_tasks:                   # optional train-and-eval recall tasks (training.recall.RecallConfig)
      mqar: {task: mqar, seq_len: 64, num_kv_pairs: 4}
    recall_only: [mqar]             # optional: the recall tasks this invocation trains (--tasks); a cell's
                                    # result.json is written once all its tasks are done, the others wait for a
                                    # later invocation
    profiles:                       # optional: --profile cpu gives interdomain_vs_s4d_cpu, out_dir ..._cpu
      cpu: {seeds: [0], base: {model: {preset: tiny}, train: {device: cpu, steps: 20, compile: null}}}
    ```
    A cell's ``recall`` mapping is merged into every recall task (``mixers: [m]`` or ``model_options``); ``lm: false``
    in the suite (or the cell) skips language-model training. Overrides on the command line address the suite:
    ``seeds=[0] base.train.steps=10 out_dir=/tmp/x``.
    """

    name: str
    out_dir: str
    cells: list[CellSpec]
    description: str = ""
    claims: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    reference: str | None = None
    lm: bool = True
    base: dict = field(default_factory=dict)
    eval: EvalSpec = field(default_factory=EvalSpec)
    recall_tasks: dict = field(default_factory=dict)
    recall_only: list[str] | None = None  # the recall tasks to train now (None: all); set by --tasks
    jobs: int = 1  # (cell, seed) runs at once, each its own subprocess on the same device; --jobs overrides

    def cell(self, name: str) -> CellSpec:
        for c in self.cells:
            if c.name == name:
                return c
        raise KeyError(name)

    def run_config(self, cell: CellSpec, seed: int, run_dir: Path) -> RunConfig:
        """The validated RunConfig of one (cell, seed)."""
        data = merge(copy.deepcopy(self.base), copy.deepcopy(cell.overrides))
        data = merge(data, {"train": {"seed": seed, "out_dir": str(run_dir)}})
        return check(from_dict(RunConfig, data))

    def recall_configs(self, cell: CellSpec, seed: int) -> dict[str, dict]:
        """{task name: RecallConfig fields} of one (cell, seed)."""
        out = {}
        for task, spec in self.recall_tasks.items():
            d = merge(copy.deepcopy(spec), copy.deepcopy(cell.recall))
            d["seed"] = seed
            out[task] = d
        return out

    def cell_seeds(self, cell: CellSpec) -> list[int]:
        return self.seeds if cell.seeds is None else cell.seeds

    def uses_lm(self, cell: CellSpec) -> bool:
        return self.lm if cell.lm is None else cell.lm


_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


def _merge_profile(base: dict, extra: dict) -> dict:
    """``merge`` where a ``None`` in ``extra`` removes the key from ``base``."""
    out = dict(base)
    for k, v in extra.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge_profile(out[k], v)
        else:
            out[k] = v
    return out


def apply_profile(data: dict, profile: str | None) -> dict:
    """The suite mapping ``data`` with its ``profiles`` section resolved: without a profile the section is dropped;
    with one, that profile is merged in and the name and out_dir get the ``_<profile>`` suffix unless it sets them.
    Raises ConfigError naming --profile and the suite's profiles when ``profile`` is not one of them.

    ``profiles: {cpu: {...}}`` holds named variants of the suite (``--profile cpu`` or ``profile=cpu``): a profile
    merges into the suite like an override (mappings merge, other values replace, ``null`` removes a key so that its
    default applies), and names the suite ``<name>_<profile>`` with ``out_dir`` ``<out_dir>_<profile>`` unless it sets
    them.
    """
    data = dict(data)
    profiles = data.pop("profiles", None) or {}
    if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
        raise ConfigError("config error: profiles must map each profile name to a mapping of suite overrides")
    if profile is None:
        return data
    if profile not in profiles:
        raise ConfigError(f"config error: --profile must be one of the suite's profiles "
                          f"({', '.join(profiles) or 'none'}), got {profile!r}")
    chosen = profiles[profile]
    out = _merge_profile(data, chosen)
    for key in ("name", "out_dir"):
        if key not in chosen and isinstance(data.get(key), str):
            out[key] = f"{data[key]}_{profile}"
    return out


def load_suite(path: str | os.PathLike, overrides: list[str] = (), profile: str | None = None) -> Suite:
    """Read and validate a suite YAML (every cell's run config is checked up front).

    Args:
        path: the suite YAML.
        overrides: ``key=value`` suite overrides, applied after the profile; ``profile=NAME`` selects a profile.
        profile: a name under the suite's ``profiles`` (None: the suite as written).
    """
    extra = parse_overrides(list(overrides))
    chosen = extra.pop("profile", None)
    if chosen is not None and profile is not None and chosen != profile:
        raise ConfigError(f"config error: --profile {profile} and profile={chosen} disagree; give one")
    profile = profile if profile is not None else chosen
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"config error: profile must be a profile name, got {profile!r}")
    data = merge(apply_profile(read_yaml_mapping(path), profile), extra)  # the run configs' checks (duplicates, ...)
    suite = from_dict(Suite, data)
    suite.cells = [from_dict(CellSpec, c, f"cells[{i}].") if isinstance(c, dict) else c
                   for i, c in enumerate(suite.cells)]
    if not suite.cells:
        raise ConfigError("config error: cells must list at least one cell")
    if not suite.seeds:
        raise ConfigError("config error: seeds must list at least one seed")
    names = [c.name for c in suite.cells]
    for n in names:
        if not _NAME.match(n):
            raise ConfigError(f"config error: cell name {n!r} may hold letters, digits and _ . + - only")
    if len(set(names)) != len(names):
        raise ConfigError(f"config error: cell names must be unique, got {names}")
    if suite.reference is not None and suite.reference not in names:
        raise ConfigError(f"config error: reference = {suite.reference!r} is not a cell; cells: {', '.join(names)}")
    if not isinstance(suite.jobs, int) or isinstance(suite.jobs, bool) or suite.jobs < 1:
        raise ConfigError(f"config error: jobs must be an integer >= 1, got {suite.jobs!r}")
    if any(m <= 0 for m in suite.eval.length_multipliers):
        raise ConfigError("config error: eval.length_multipliers must be > 0")
    for c in suite.cells:
        if suite.uses_lm(c):
            suite.run_config(c, suite.seeds[0], Path(suite.out_dir) / "check")
    if suite.recall_only is not None:
        unknown = [t for t in suite.recall_only if t not in suite.recall_tasks]
        if unknown or not suite.recall_only:
            raise ConfigError(f"config error: recall_only (--tasks) must name recall tasks of the suite, got "
                              f"{suite.recall_only}; tasks: {', '.join(suite.recall_tasks) or 'none'}")
    if suite.recall_tasks:
        for c in suite.cells:
            for task, d in suite.recall_configs(c, 0).items():
                from_dict(RecallConfig, d, f"recall_tasks.{task}.")
    return suite
