"""Text generation from a trained model (sampling options of ``transformers``' ``generate``)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase


@torch.no_grad()
def generate_text(
    model: torch.nn.Module,
    tok: PreTrainedTokenizerBase,
    prompt: str = "",
    max_new_tokens: int = 200,
    do_sample: bool = True,
    temperature: float = 0.8,
    top_k: int | None = 50,
    top_p: float | None = 0.95,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> str:
    """The continuation of ``prompt`` (without the prompt). The prompt is preceded by the document separator, as every
    training document was."""
    torch.manual_seed(seed)
    sep = tok.eos_token_id if tok.eos_token_id is not None else tok.bos_token_id
    ids = ([sep] if sep is not None else []) + tok(prompt, add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids], device=device)
    kwargs = dict(do_sample=do_sample, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id)
    if do_sample:
        kwargs.update(temperature=temperature, top_k=top_k, top_p=top_p)
    model.eval()
    out = model.generate(x, **kwargs)
    return tok.decode(out[0, x.shape[1] :].tolist(), skip_special_tokens=True)
