"""torch.compile vs eager, one 2-layer model per mixer: loss and gradients of one forward + backward.

    python benchmarks/gpu_compile_check.py                  # GPU: `small` preset, bf16 autocast, B=4, T=512
    python benchmarks/gpu_compile_check.py --cpu-smoke      # CPU: `tiny`-sized stand-ins, fp32, B=2, T=32
    python benchmarks/gpu_compile_check.py --mixers gdn natsl --backend inductor --mode max-autotune-no-cudagraphs
    python benchmarks/gpu_compile_check.py --scope blocks   # train.compile_scope "blocks": each block + the loss

For every mixer name in ``hybrid_attention.models.mixers.MIXER_BUILDERS`` (read at run time, so new mixers are
covered) it builds ``HybridConfig.from_preset("small", layers=[name, name])`` with float32 weights in train mode,
runs loss = LM loss of random tokens and its backward in eager mode, then the same through ``torch.compile(model)``
(same parameters, same seed), and compares: loss relative difference and the largest relative RMS
||g_compiled - g_eager|| / ||g_eager|| over the parameters. Bars (bf16): loss 1e-2 relative; a parameter's gradient
passes when within 5e-2 of eager, or when it is no further from the float32 eager gradient (autocast off) than twice
eager bf16's own distance from it (NOISE_RATIO): compiled code is then as accurate as eager at this precision. The
second rule exists for gradients that sum over every token (GDN's A_log: 5.2e-2 compiled vs eager on the H200, both
bf16 roundings of the same float32 value); it still fails a wrong compiled gradient, which is far from float32.
One table row per mixer with PASS / FAIL; an exception (compile or run) is caught per mixer and printed on one
line (FAIL, not fatal). Graph breaks counted by Dynamo are reported (a break is not a failure). With ``--out`` (default
``$OUT``) set, the rows go to ``<--out>/gpu_compile_check.json``. Exit status 0 only if every row passed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from hybrid_attention.training.compile import COMPILE_SCOPES, compile_model  # noqa: E402

LOSS_BAR, GRAD_BAR, NOISE_RATIO = 1e-2, 5e-2, 2.0
TINY = dict(hidden_size=64, num_heads=2, head_dim=32, state_size=16, chunk_size=16)


def one_line(exc: BaseException, limit: int = 300) -> str:
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg[:limit]}{'...' if len(msg) > limit else ''}"


def build(name: str, smoke: bool, device: str):
    from hybrid_attention.models import HybridConfig, HybridForCausalLM

    overrides = dict(TINY) if smoke else {}
    cfg = HybridConfig.from_preset("small", layers=[name, name], **overrides)
    torch.manual_seed(0)
    return HybridForCausalLM(cfg).to(device).float().train()


def loss_and_grads(model, fn, ids, amp: bool, device: str):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        loss = fn(ids, labels=ids).loss
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().float().item(), grads


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (nan propagates)."""
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def judge_grads(g_c: dict, g_e: dict, g_32: dict | None) -> tuple[bool, float, str | None, float | None]:
    """(pass, worst compiled-vs-eager rel-RMS, its parameter, worst noise ratio) over the parameters both sides have.

    A gradient passes within GRAD_BAR of eager; outside it, when rel_rms(compiled, fp32) <= NOISE_RATIO ·
    rel_rms(eager, fp32) (``g_32``: float32 eager gradients; None: the plain bar alone decides). The ratio is None
    when no gradient needed it."""
    ok, worst, worst_name, worst_ratio = True, 0.0, None, None
    for n, ge in g_e.items():
        if n not in g_c:
            continue
        r = rel_rms(g_c[n], ge)
        if not r < worst:  # nan counts as worst
            worst, worst_name = r, n
        if r <= GRAD_BAR:
            continue
        ratio = rel_rms(g_c[n], g_32[n]) / max(rel_rms(ge, g_32[n]), 1e-30) if g_32 is not None else float("inf")
        ok = ok and ratio <= NOISE_RATIO  # nan fails
        worst_ratio = ratio if worst_ratio is None or not ratio < worst_ratio else worst_ratio
    return ok, worst, worst_name, worst_ratio


def compare(name: str, args, device: str) -> dict:
    import torch._dynamo

    row = {"mixer": name, "status": "FAIL", "error": None}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = build(name, args.cpu_smoke, device)
    row["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=gen).to(device)
    amp = device == "cuda" and not args.fp32
    t0 = time.time()
    l_e, g_e = loss_and_grads(model, model, ids, amp, device)
    row["eager_s"] = time.time() - t0
    if args.scope == "blocks":  # in place on a copy (train.compile_scope "blocks"): model itself stays eager
        owner = copy.deepcopy(model)
        compiled = compile_model(owner, "blocks", mode=args.mode, backend=args.backend)
    else:
        owner = model
        compiled = torch.compile(model, backend=args.backend, mode=args.mode, fullgraph=args.fullgraph)
    t0 = time.time()
    l_c, g_c = loss_and_grads(owner, compiled, ids, amp, device)
    row["compiled_first_s"] = time.time() - t0
    breaks = torch._dynamo.utils.counters["graph_break"]  # reason -> count
    row["graph_breaks"] = int(sum(breaks.values()))
    row["graph_break_reasons"] = {" ".join(str(k).split())[:240]: int(n) for k, n in breaks.items()}
    row["loss_eager"], row["loss_compiled"] = l_e, l_c
    row["loss_rel"] = abs(l_c - l_e) / max(abs(l_e), 1e-30)
    g_32 = loss_and_grads(model, model, ids, False, device)[1] if amp else None  # the float32 reference
    missing = sorted(set(g_e) ^ set(g_c))
    grads_ok, worst, worst_name, worst_ratio = judge_grads(g_c, g_e, g_32)
    row["grad_rel_rms"], row["grad_worst_param"], row["grad_noise_ratio"] = worst, worst_name, worst_ratio
    ok = row["loss_rel"] <= LOSS_BAR and grads_ok and not missing
    if missing:
        row["error"] = f"gradients missing on one side: {missing[:4]}"
    row["status"] = "PASS" if ok else "FAIL"
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="CPU, tiny widths, fp32, B=2, T=32 (tests this script)")
    p.add_argument("--mixers", nargs="+", help="subset of MIXER_BUILDERS (default: all)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--mode", default=None, help="torch.compile mode (default: None)")
    p.add_argument("--fullgraph", action="store_true")
    p.add_argument("--scope", choices=COMPILE_SCOPES, default="model",
                   help="what is compiled (train.compile_scope): the whole model or each block and the loss "
                   "(--fullgraph applies to the whole model only)")
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast on the GPU")
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder of gpu_compile_check.json (default: $OUT)")
    p.add_argument("--traceback", action="store_true", default=bool(os.environ.get("COMPILE_CHECK_TRACEBACK")),
                   help="print a failing mixer's traceback (default: COMPILE_CHECK_TRACEBACK set)")
    args = p.parse_args(argv)
    from hybrid_attention.models.mixers import MIXER_BUILDERS

    device = "cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.cpu_smoke:
        print("no CUDA device: running the --cpu-smoke configuration")
        args.cpu_smoke = True
    args.batch = args.batch or (2 if args.cpu_smoke else 4)
    args.seq = args.seq or (32 if args.cpu_smoke else 512)
    names = args.mixers or list(MIXER_BUILDERS)
    unknown = [n for n in names if n not in MIXER_BUILDERS]
    if unknown:
        print(f"error: unknown mixers {unknown}; allowed: {sorted(MIXER_BUILDERS)}", file=sys.stderr)
        return 2
    env = f"torch {torch.__version__}"
    try:
        import triton

        env += f", triton {triton.__version__}"
    except Exception:  # noqa: BLE001
        pass
    dev_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"{dev_name}, {env}; preset small{' (tiny widths)' if args.cpu_smoke else ''}, 2 layers, B={args.batch}, "
          f"T={args.seq}, {'bf16 autocast' if device == 'cuda' and not args.fp32 else 'fp32'}, "
          f"torch.compile(backend={args.backend}, mode={args.mode}, fullgraph={args.fullgraph}, scope={args.scope})",
          flush=True)
    rows = []
    for name in names:
        try:
            row = compare(name, args, device)
        except Exception as exc:  # noqa: BLE001 - one line per mixer, not fatal
            row = {"mixer": name, "status": "FAIL", "error": one_line(exc)}
            if args.traceback:
                traceback.print_exc()
        rows.append(row)
        if row.get("error"):
            print(f"  {name}: {row['error']}", flush=True)
        else:
            print(f"  {name}: {row['status']}  loss rel {row['loss_rel']:.2e}  grad rel-RMS {row['grad_rel_rms']:.2e} "
                  f"({row['grad_worst_param']})  compile+run {row['compiled_first_s']:.1f} s", flush=True)
            for reason, n in row["graph_break_reasons"].items():
                print(f"    graph break x{n}: {reason}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()

    def f(row, key, fmt):
        v = row.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    print()
    print(f"| mixer | params (M) | loss eager | loss compiled | loss rel (<= {LOSS_BAR:g}) | "
          f"grad max rel-RMS (<= {GRAD_BAR:g}) | worst param | vs fp32 / eager's (<= {NOISE_RATIO:g}) | "
          f"graph breaks | eager s | compile+run s | result |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|")
    for r in rows:
        res = r["status"] + (f" ({r['error']})" if r.get("error") else "")
        print(f"| {r['mixer']} | {f(r, 'params_m', '.2f')} | {f(r, 'loss_eager', '.5f')} | "
              f"{f(r, 'loss_compiled', '.5f')} | {f(r, 'loss_rel', '.2e')} | {f(r, 'grad_rel_rms', '.2e')} | "
              f"{r.get('grad_worst_param') or '-'} | {f(r, 'grad_noise_ratio', '.2f')} | "
              f"{f(r, 'graph_breaks', 'd')} | {f(r, 'eager_s', '.1f')} | {f(r, 'compiled_first_s', '.1f')} | {res} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_compile_check.json"), "w") as fh:
            json.dump({"device": dev_name, "env": env, "args": vars(args), "rows": rows}, fh, indent=1)
    return 0 if all(r["status"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
