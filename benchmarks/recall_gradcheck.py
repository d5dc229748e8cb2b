"""Does a recall suite's training step on the device compute the reference loss and gradients? One batch per (cell,
task), the model as the suite trains it (its kernels, fp32, its TF32 setting, eager and/or compiled in the suite's
mode), against a float64 copy of the same weights on the CPU (the PyTorch reference ops, the test oracle).

    python -m benchmarks.recall_gradcheck --cells gdn natsl_hybrid_all_softmax --tasks mqar_t256 passkey
    python -m benchmarks.recall_gradcheck --dryrun        # CPU smoke test: toy sizes, fp32 CPU vs float64 CPU
    TRITON_INTERPRET=1 python -m benchmarks.recall_gradcheck --backend triton --batch 2 --variants eager \
        --cells gdn --tasks mqar_t256                      # the Triton kernels' logic at the suite's shapes, on a CPU

Why: a model that stays at chance on a recall task on the GPU while the same layers learn on the CPU at smaller sizes is
either a slow learner or hit by a GPU-only error in a kernel's backward (fp32 buffers, chunk 64, B 64); this tells the
two apart before the rows are read as science. Per row: the loss of both, the worst relative gradient error over the
parameters (``|g - g_ref| / |g_ref|`` per tensor, tensors whose reference gradient is below 1e-6 of the largest
skipped), its parameter, and the error of the whole gradient vector. fp32 without TF32 agrees with float64 to ~1e-5 at
these sizes; a row above ``--tol`` (default 1e-2) is marked FAIL.
"""

from __future__ import annotations

import argparse
import copy
import json
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.recall_suite import add_selection_args, selected_tasks
from hybrid_attention.config.run_config import from_dict
from hybrid_attention.device import set_tf32
from hybrid_attention.evaluation.recall import labels_per_row, query_logits, query_positions
from hybrid_attention.training.recall import RecallConfig, build_recall_model, compiled_backbone, make_examples

VARIANTS = ("eager", "compiled")  # compiled: the suite's compile_mode (CUDA graphs for credible_recall)
KERNEL_MIXERS = ("gdn", "natsl", "interdomain")  # the mixers whose layers take backend="triton"


def with_backend(fields: dict, backend: str) -> dict:
    """RecallConfig fields with ``backend`` pinned for every mixer in KERNEL_MIXERS (``model_options.mixer_options``;
    the suite's own options kept). "triton" on a CPU needs ``TRITON_INTERPRET=1``."""
    mo = dict(fields.get("model_options") or {})
    opts = {k: dict(v) for k, v in (mo.get("mixer_options") or {}).items()}
    for name in KERNEL_MIXERS:
        opts[name] = {**opts.get(name, {}), "backend": backend}
    return {**fields, "model_options": {**mo, "mixer_options": opts}}


def loss_and_grads(model, backbone, x: torch.Tensor, y: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """The recall loss (cross-entropy at the queried positions, as ``recall.train_step``) of x, y [B, T] and the
    gradient of every parameter, as float64 on the CPU."""
    model.zero_grad(set_to_none=True)
    n = labels_per_row(y.cpu())
    pos = query_positions(y, n)
    logits = query_logits(model, x, y, backbone, pos)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # the trainer's float32 loss
    loss = F.cross_entropy(logits, y.gather(1, pos).flatten())
    loss.backward()
    grads = {k: p.grad.detach().double().cpu() for k, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def grad_errors(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict:
    """Relative errors of ``grads`` against ``ref`` (same names): per tensor ``|g - r| / |r|`` for tensors whose
    reference norm is at least 1e-6 of the largest one, the worst of them and its name, and the error of the whole
    concatenated gradient. A parameter missing from either side is an error (its name is reported)."""
    if grads.keys() != ref.keys():
        missing = sorted(set(grads) ^ set(ref))
        raise ValueError(f"gradients of different parameters: {missing[:4]}")
    norms = {k: r.norm().item() for k, r in ref.items()}
    floor = 1e-6 * max(norms.values(), default=0.0)
    per = {k: ((grads[k] - r).norm() / r.norm()).item() for k, r in ref.items() if norms[k] > floor}
    worst = max(per, key=per.get) if per else ""
    total = (torch.cat([(grads[k] - r).flatten() for k, r in ref.items()]).norm()
             / torch.cat([r.flatten() for r in ref.values()]).norm()).item()
    return {"worst": per.get(worst, 0.0), "worst_param": worst, "total": total, "checked": len(per)}


def check(cfg: RecallConfig, mixer: str, variant: str, device: torch.device, batch: int) -> dict:
    """One (cell, task, variant) row: the device step against the float64 CPU reference on one batch."""
    set_tf32(device, cfg.tf32)  # the suite's recipe, as train_and_eval applies it
    torch.manual_seed(cfg.seed)
    model = build_recall_model(cfg, mixer, cfg.d_models[0])
    ref = copy.deepcopy(model).to(torch.float64)  # same weights; CPU float64: every op takes its reference form
    for m in ref.modules():  # also where the suite pins a backend (e.g. "triton" under TRITON_INTERPRET=1)
        if isinstance(getattr(m, "backend", None), str):
            m.backend = "auto"
    model = model.to(device)
    backbone = compiled_backbone(replace(cfg, compile=variant == "compiled"), model)
    x, y = make_examples(cfg, batch, seed=cfg.seed + 1)
    loss, grads = loss_and_grads(model, backbone, x.to(device), y.to(device))
    if variant == "compiled":  # a CUDA-graph replay, as the trainer's second and later steps run
        loss, grads = loss_and_grads(model, backbone, x.to(device), y.to(device))
    loss_ref, grads_ref = loss_and_grads(ref, ref.model, x, y)
    return {"loss": loss, "loss_ref": loss_ref, "loss_rel": abs(loss - loss_ref) / abs(loss_ref),
            **grad_errors(grads, grads_ref)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_args(p, VARIANTS)
    p.add_argument("--batch", type=int, default=None, help="examples in the batch (default: the task's batch_size)")
    p.add_argument("--tol", type=float, default=1e-2, help="worst relative gradient error that still passes")
    p.add_argument("--backend", default="auto", choices=("auto", "triton"),
                   help="the device model's gdn / natsl / interdomain layers (triton on a CPU: TRITON_INTERPRET=1)")
    p.add_argument("--dryrun", action="store_true", help="CPU, toy sizes (a smoke test of this file)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.dryrun or not torch.cuda.is_available() else "cuda")
    # toy: two complete 64-token NAtS-L chunks and a partial one (forced routing acts across chunks)
    toy = dict(vocab_size=256, seq_len=144, num_kv_pairs=4, batch_size=4, d_models=[32], device="cpu")
    tasks = selected_tasks(args, toy if args.dryrun else None)
    print(f"recall_gradcheck: {args.suite}, device {device}, torch {torch.__version__}")
    rows = []
    for cell, task, d in tasks:
        cfg = from_dict(RecallConfig, with_backend(d, args.backend) if args.backend != "auto" else d)
        for variant in args.variants:
            if variant == "compiled" and not cfg.compile:
                continue
            try:
                r = check(cfg, cfg.mixers[0], variant, device, args.batch or cfg.batch_size)
            except Exception as e:  # noqa: BLE001  (one failing row is recorded, the others still run)
                print(f"  {cell} {task} {variant}: ERROR {type(e).__name__}: {str(e)[:200]}")
                rows.append(dict(cell=cell, task=task, variant=variant, error=f"{type(e).__name__}: {e}"))
                continue
            r["ok"] = r["worst"] <= args.tol and r["loss_rel"] <= args.tol
            rows.append(dict(cell=cell, task=task, variant=variant, **r))
    print("\n| cell | task | variant | loss | loss float64 | worst grad rel. err (parameter) | whole grad | |")
    print("|---|---|---|---:|---:|---|---:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['cell']} | {r['task']} | {r['variant']} | error | | {r['error'][:60]} | | FAIL |")
            continue
        print(f"| {r['cell']} | {r['task']} | {r['variant']} | {r['loss']:.6f} | {r['loss_ref']:.6f} | "
              f"{r['worst']:.1e} ({r['worst_param']}) | {r['total']:.1e} | {'ok' if r['ok'] else 'FAIL'} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "recall_gradcheck.json").write_text(json.dumps(
            dict(device=str(device), torch=torch.__version__, suite=args.suite, tol=args.tol, rows=rows), indent=1))


if __name__ == "__main__":
    main()
