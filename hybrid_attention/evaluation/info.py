"""What a trained model is: parameters, mixers, state size, NAtS-L softmax fractions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from hybrid_attention.layers.natsl.routing import RoutingRecorder

ASSUMED_SOFTMAX_FRACTION = 0.5  # NAtS-L state sizes assume half of the chunks routed to softmax unless told


def state_size(model: torch.nn.Module, seq_len: int, softmax_fraction: float = ASSUMED_SOFTMAX_FRACTION) -> int:
    """Real numbers of mixer state per sequence after ``seq_len`` tokens, with every NAtS-L layer at the given softmax
    fraction (its KV cache grows with the fraction of chunks routed to softmax): ``model.state_size`` with one fraction
    for every NAtS-L layer; ``info`` and the demo's table both use it."""
    return int(model.state_size(seq_len, {i: softmax_fraction for i in model.routing_layers()}))


def has_routing(model: torch.nn.Module) -> bool:
    """Whether the model has NAtS-L layers."""
    return bool(model.routing_layers())


def measured_fraction(routing: dict) -> float | None:
    """Mean softmax fraction over the layers and decision heads of ``{layer: [fraction per head]}`` (None if empty)."""
    values = [float(x) for fr in routing.values() for x in (fr.flatten().tolist() if hasattr(fr, "flatten") else fr)]
    return sum(values) / len(values) if values else None


def state_note(routing_model: bool, measured: float | None, softmax_fraction: float = ASSUMED_SOFTMAX_FRACTION,
               measured_on: str = "the sample text") -> str:
    """How a state size counts the NAtS-L layers, as one sentence; empty for models without NAtS-L layers. E.g.
    "NAtS-L layers counted with 50% of their chunks routed to softmax attention (whose KV cache grows with that
    share); the router sent 12% of the sample text's chunks there".

    Args:
        routing_model: whether the model has NAtS-L layers.
        measured: the softmax share the router chose on ``measured_on`` (None: not measured).
        softmax_fraction: the share the state size is counted with.
        measured_on: what ``measured`` was measured on.
    """
    if not routing_model:
        return ""
    seen = (f"the router sent {measured:.0%} of {measured_on}'s chunks there" if measured is not None
            else "the router's share was not measured")
    return (f"NAtS-L layers counted with {softmax_fraction:.0%} of their chunks routed to softmax attention (whose KV "
            f"cache grows with that share); {seen}")


@torch.no_grad()
def model_info(
    model: torch.nn.Module,
    tok: PreTrainedTokenizerBase | None = None,
    seq_lens: Sequence[int] = (1024, 4096, 16384),
    sample_text: str | None = None,
) -> dict:
    """{parameters, non_embedding_parameters, layers, state_size: {len: n}, routing: {layer: [fraction per head]}}.

    Routing fractions are those of one forward pass over ``sample_text`` (NAtS-L layers only; empty otherwise).
    """
    cfg = model.config
    emb = sum(p.numel() for n, p in model.named_parameters() if "embeddings" in n or "lm_head" in n)
    total = sum(p.numel() for p in model.parameters())
    info = {
        "parameters": total,
        "non_embedding_parameters": total - emb,
        "layers": list(cfg.mixer_types),
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "state_size": {int(n): state_size(model, n) for n in seq_lens},
        "routing": {},
    }
    if has_routing(model):
        info["state_softmax_fraction"] = ASSUMED_SOFTMAX_FRACTION
        info["measured_softmax_fraction"] = None
    if sample_text and tok is not None and any(m == "natsl" for m in cfg.mixer_types):
        ids = tok(sample_text, add_special_tokens=False)["input_ids"][:2048]
        model.eval()
        rec = RoutingRecorder()
        with rec.attach(model):
            model(input_ids=torch.tensor([ids], device=next(model.parameters()).device), use_cache=False)
        info["routing"] = {int(i): f.float().cpu().tolist() for i, f in rec.fractions().items()}
        info["measured_softmax_fraction"] = measured_fraction(info["routing"])
    return info


def format_info(info: dict) -> str:
    """The text of ``hybrid-attention info``: one line per item of :func:`model_info`'s dict (plus ``verified``, the
    load's manifest check, when the caller added it)."""
    note = state_note("state_softmax_fraction" in info, info.get("measured_softmax_fraction"),
                      info.get("state_softmax_fraction", ASSUMED_SOFTMAX_FRACTION))
    lines = [
        f"parameters: {info['parameters']:,} ({info['non_embedding_parameters']:,} without embeddings)",
        f"layers: {len(info['layers'])} x hidden {info['hidden_size']}: {', '.join(info['layers'])}",
        f"vocab: {info['vocab_size']}",
        "state size (numbers per sequence): "
        + ", ".join(f"{n:,} at {length:,} tokens" for length, n in info["state_size"].items()),
        *([f"  {note}"] if note else []),
    ]
    if "verified" in info:
        lines.append("integrity: verified (manifest.json present, every listed file's size and sha256 checked)"
                     if info["verified"] else
                     "integrity: unverified (no manifest.json: sizes and checksums of the weights not checked)")
    if info["routing"]:
        lines.append("NAtS-L softmax fraction per head (measured on the sample text):")
        for layer, fr in info["routing"].items():
            lines.append(f"  layer {layer}: " + " ".join(f"{x:.2f}" for x in fr))
    return "\n".join(lines)
