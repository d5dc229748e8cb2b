"""What a trained model is: parameters, mixers, state size, NAtS-L softmax fractions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase


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
        "state_size": {int(n): int(model.state_size(n)) for n in seq_lens},
        "routing": {},
    }
    if sample_text and tok is not None and any(m == "natsl" for m in cfg.mixer_types):
        ids = tok(sample_text, add_special_tokens=False)["input_ids"][:2048]
        model.eval()
        model(input_ids=torch.tensor([ids], device=next(model.parameters()).device), use_cache=False)
        info["routing"] = {int(i): f.detach().float().cpu().tolist() for i, f in model.routing_fractions().items()}
    return info


def format_info(info: dict) -> str:
    lines = [
        f"parameters: {info['parameters']:,} ({info['non_embedding_parameters']:,} without embeddings)",
        f"layers: {len(info['layers'])} x hidden {info['hidden_size']}: {', '.join(info['layers'])}",
        f"vocab: {info['vocab_size']}",
        "state size (numbers per sequence): "
        + ", ".join(f"{n:,} at {length:,} tokens" for length, n in info["state_size"].items()),
    ]
    if info["routing"]:
        lines.append("NAtS-L softmax fraction per head:")
        for layer, fr in info["routing"].items():
            lines.append(f"  layer {layer}: " + " ".join(f"{x:.2f}" for x in fr))
    return "\n".join(lines)
