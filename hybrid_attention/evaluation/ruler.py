"""RULER's synthetic long-context tasks on a trained model, offline (``hybrid-attention eval ruler``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase, StoppingCriteria, StoppingCriteriaList

from hybrid_attention.data.ruler import Haystack, RulerSample, TooShort, ruler_samples

from .generation import prompt_ids
from .tables import format_table

_CONTROL = re.compile(r"[\x00-\x1f]")


def clean_prediction(text: str) -> str:
    """RULER's post-processing of a generation: control characters become newlines, outer whitespace is dropped."""
    return _CONTROL.sub("\n", text.strip()).strip()


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """The fraction of ``answers`` that occur in ``prediction``, ignoring case (RULER's metric for these tasks)."""
    low = prediction.lower()
    return sum(a.lower() in low for a in answers) / len(answers)


class _AnswersFound(StoppingCriteria):
    """Stops generation once every expected answer is in the generated text (the score cannot change after that)."""

    def __init__(self, tok: PreTrainedTokenizerBase, n_prompt: int, answers: Sequence[str]):
        self.tok, self.n_prompt, self.answers = tok, n_prompt, answers

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        text = self.tok.decode(input_ids[0, self.n_prompt :].tolist(), skip_special_tokens=True)
        done = string_match_all(text, self.answers) == 1.0
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


@torch.no_grad()
def greedy_answer(model: torch.nn.Module, tok: PreTrainedTokenizerBase, sample: RulerSample,
                  device: torch.device | str = "cpu") -> str:
    """The model's greedy continuation of ``sample.text`` (at most ``sample.max_new_tokens`` tokens), decoded."""
    ids = prompt_ids(tok, sample.text)
    x = torch.tensor([ids], device=device)
    out = model.generate(x, do_sample=False, max_new_tokens=sample.max_new_tokens, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id,
                         stopping_criteria=StoppingCriteriaList([_AnswersFound(tok, len(ids), sample.answers)]))
    return tok.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)


def load_haystack(paths: Sequence[str] | None = None, max_length: int = 4096) -> Haystack:
    """The haystack corpus: the files or folders ``paths`` (every readable text and ``.py`` file, in sorted order),
    else the embedded standard-library corpus (its held-out documents first, then enough of the rest for contexts of
    ``max_length`` tokens of up to 8 characters each; the corpus repeats beyond that)."""
    from hybrid_attention.data.corpus import LOCAL_SUFFIXES, local_corpus, stdlib_corpus

    if paths:
        corpus = local_corpus(paths, suffixes=LOCAL_SUFFIXES, splits=False)
    else:
        corpus = stdlib_corpus(max_bytes=max(4_000_000, 8 * max_length))
    return Haystack(corpus.validation + corpus.train, corpus.source)


def build_samples(tok: PreTrainedTokenizerBase, tasks: Sequence[str], lengths: Sequence[int], samples: int,
                  haystack: Haystack, seed: int = 0, max_new_tokens: int | None = None) -> dict[tuple[str, int],
                                                                                            list[RulerSample]]:
    """Every (task, length)'s samples, sized with ``tok`` as the model reads a prompt (separator first); ValueError
    naming every task that a length is too short for, before any model work."""
    def count(text: str) -> int:
        return len(prompt_ids(tok, text))

    out, short = {}, []
    for task in tasks:
        for length in lengths:
            try:
                out[task, length] = ruler_samples(task, length, samples, count, haystack, seed, max_new_tokens)
            except TooShort as e:
                short.append(e)
    if short:
        by_length: dict[int, list[str]] = {}
        for e in short:
            by_length.setdefault(e.length, []).append(f"{e.task} (needs {e.needed:,})")
        raise ValueError("; ".join(f"{n:,} is too short for {', '.join(t)}" for n, t in by_length.items())
                         + " tokens: a task's smallest prompt plus its answer budget")
    return out


def evaluate_ruler(model: torch.nn.Module, tok: PreTrainedTokenizerBase,
                   samples: dict[tuple[str, int], list[RulerSample]], device: torch.device | str = "cpu",
                   log: Callable[[str], None] | None = None) -> dict:
    """Generate and score every sample; returns {"rows": [{task, length, score, all_found, samples, prompt_tokens,
    max_new_tokens}], "scores": {task: {length: score}}, "average": {length: mean score over the tasks},
    "predictions": [{task, length, index, answers, prediction, score, prompt_tokens}]}. ``log`` gets one line per
    (task, length) as it finishes.

    The prompts come from ``data/ruler.py``, sized with the model's own tokenizer. The model continues each prompt by
    greedy decoding for at most the sample's answer budget (stopping early at the end-of-text token or once every
    expected answer is in the text, which cannot change the score), and a sample scores as RULER's ``string_match_all``:
    the fraction of its expected answers that appear in the generated text, ignoring case. A task's score at a length is
    the mean over its samples; the average row is the mean over the tasks.
    """
    model.eval()
    rows, predictions = [], []
    for (task, length), group in samples.items():
        scores = []
        for s in group:
            pred = clean_prediction(greedy_answer(model, tok, s, device))
            scores.append(string_match_all(pred, s.answers))
            predictions.append({"task": task, "length": length, "index": s.index, "answers": s.answers,
                                "prediction": pred, "score": scores[-1], "prompt_tokens": s.prompt_tokens})
        row = {"task": task, "length": length, "score": sum(scores) / len(scores),
               "all_found": sum(x == 1.0 for x in scores) / len(scores), "samples": len(scores),
               "prompt_tokens": round(sum(s.prompt_tokens for s in group) / len(group)),
               "max_new_tokens": group[0].max_new_tokens}
        rows.append(row)
        if log is not None:
            log(f"ruler: {task} at {length:,} tokens: score {row['score']:.2f} ({len(scores)} samples)")
    scores: dict[str, dict[int, float]] = {}
    for r in rows:
        scores.setdefault(r["task"], {})[r["length"]] = r["score"]
    lengths = sorted({r["length"] for r in rows})
    average = {n: sum(s[n] for s in scores.values()) / len(scores) for n in lengths}
    return {"rows": rows, "scores": scores, "average": average, "predictions": predictions}


def ruler_table(result: dict) -> str:
    """Tasks down, lengths across (the score, 0 to 1), the average over the tasks last."""
    lengths = sorted(result["average"])
    rows = [{"task": t, **{str(n): s.get(n) for n in lengths}} for t, s in result["scores"].items()]
    rows.append({"task": "average", **{str(n): result["average"][n] for n in lengths}})
    return format_table(rows, [("task", "task", "")] + [(str(n), f"{n:,}", ".2f") for n in lengths])


