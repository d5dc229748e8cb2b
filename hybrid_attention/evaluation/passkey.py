"""Passkey retrieval accuracy of a trained language model at chosen context lengths and needle depths.

Each trial builds a prompt of about ``length`` tokens (filler text, the 5-digit key at ``depth``, the question) and
checks, teacher-forced, whether the model's greedy prediction reproduces every token of the answer; that is exactly
what greedy decoding would produce. Accuracy is the fraction of trials answered exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from hybrid_attention.data.passkey import passkey_prompt

from .tables import format_table


def _ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _n_filler_for(tok: PreTrainedTokenizerBase, length: int) -> int:
    """Filler repetitions whose prompt is closest to, and not longer than, ``length`` tokens."""
    base = len(_ids(tok, passkey_prompt(0, 0.5, 0)[0]))
    per = len(_ids(tok, passkey_prompt(10, 0.5, 0)[0])) - base
    return max(0, (length - base - 8) * 10 // max(per, 1))


@torch.no_grad()
def passkey_accuracy(
    model: torch.nn.Module,
    tok: PreTrainedTokenizerBase,
    lengths: Sequence[int] = (256, 512, 1024),
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    trials: int = 4,
    device: torch.device | str = "cpu",
) -> list[dict]:
    """Rows {length, depth, accuracy, trials, prompt_tokens}, one per (length, depth)."""
    model.eval()
    rows = []
    shortest = len(_ids(tok, passkey_prompt(0, 0.5, 0)[0])) + 8
    for length in lengths:
        if length < shortest:
            raise ValueError(f"passkey length {length} is shorter than the bare prompt ({shortest} tokens)")
        n_filler = _n_filler_for(tok, length)
        for depth in depths:
            correct, n_tokens = 0, 0
            for t in range(trials):
                prompt, answer = passkey_prompt(n_filler, depth, seed=1000 * length + 10 * t + int(100 * depth))
                p, a = _ids(tok, prompt), _ids(tok, answer)
                x = torch.tensor([p + a], device=device)
                pred = model(input_ids=x, use_cache=False).logits[0, len(p) - 1 : -1].argmax(-1)
                correct += int(pred.tolist() == a)
                n_tokens = len(p)
            rows.append({"length": length, "depth": depth, "accuracy": correct / trials, "trials": trials,
                         "prompt_tokens": n_tokens})
    return rows


def passkey_table(rows: list[dict]) -> str:
    return format_table(rows, [("length", "length", "d"), ("depth", "depth", ".2f"), ("prompt_tokens", "tokens", "d"),
                               ("accuracy", "accuracy", ".2f"), ("trials", "trials", "d")])
