"""``eval ruler`` on a trained tiny model: RULER's scoring (partial credit, case), greedy generation that stops once
every answer is written, and the command: ruler.json and ruler.png in the run folder, one error line for an unknown
task or a length too short, with nothing written."""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from hybrid_attention.cli import main
from hybrid_attention.data.ruler import Haystack, ruler_samples
from hybrid_attention.evaluation.generation import prompt_ids
from hybrid_attention.evaluation.loading import load_model
from hybrid_attention.evaluation.ruler import clean_prediction, evaluate_ruler, greedy_answer, string_match_all

HAYSTACK = Haystack(["def f(x):\n    return x + 1\n"] * 50, "test")


def test_scoring_is_rulers_string_match_all():
    assert string_match_all("The numbers are 1234567 and 7654321.", ["1234567", "7654321"]) == 1.0
    assert string_match_all("only 1234567", ["1234567", "7654321", "1111111", "2222222"]) == 0.25
    assert string_match_all("ABCDE fghij", ["abcde", "FGHIJ"]) == 1.0  # case ignored
    assert string_match_all("", ["x"]) == 0.0
    assert clean_prediction("  a\tb\x00c\n ") == "a\nb\nc"


@torch.no_grad()
def _greedy(model, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens by full forward passes (no cache): the reference for ``generate``."""
    out = list(ids)
    for _ in range(n):
        out.append(int(model(input_ids=torch.tensor([out]), use_cache=False).logits[0, -1].argmax()))
    return out[len(ids) :]


def test_generation_is_greedy_from_the_separator_and_the_prompt(tiny_run):
    loaded = load_model(tiny_run)
    model, tok = loaded.model, loaded.tokenizer
    sample = ruler_samples("niah_single_1", 700, 1, lambda t: len(prompt_ids(tok, t)), HAYSTACK)[0]
    full = greedy_answer(model, tok, replace(sample, max_new_tokens=24, answers=["\x00never"]))
    assert full == tok.decode(_greedy(model, prompt_ids(tok, sample.text), 24), skip_special_tokens=True)


def test_scores_and_the_stop_once_every_answer_is_written(tiny_run):
    """The trained model with a head that always writes "7": an answer "777" is written after three tokens (the
    generation stops there, score 1), one of two answers scores 0.5 and runs the whole budget."""
    loaded = load_model(tiny_run)
    model, tok = loaded.model, loaded.tokenizer
    seven = tok("7", add_special_tokens=False)["input_ids"][0]
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    torch.nn.init.zeros_(head.weight)
    with torch.no_grad():
        head.bias.fill_(-1.0)
        head.bias[seven] = 1.0
    model.lm_head = head
    sample = ruler_samples("niah_single_1", 700, 1, lambda t: len(prompt_ids(tok, t)), HAYSTACK)[0]
    groups = {("niah_single_1", 700): [replace(sample, max_new_tokens=20, answers=["777"])],
              ("niah_single_1", 800): [replace(sample, length=800, max_new_tokens=20, answers=["777", "1234567"])]}
    res = evaluate_ruler(model, tok, groups)
    assert [p["prediction"] for p in res["predictions"]] == ["777", "7" * 20]
    assert [r["score"] for r in res["rows"]] == [1.0, 0.5] and [r["all_found"] for r in res["rows"]] == [1.0, 0.0]
    assert res["scores"] == {"niah_single_1": {700: 1.0, 800: 0.5}} and res["average"] == {700: 1.0, 800: 0.5}


def test_the_command_writes_results_and_plot_into_the_run_folder(tiny_run, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["eval", "ruler", "--checkpoint", str(tiny_run), "--tasks", "niah_single_1", "niah_multikey_2",
            "--lengths", "700", "600", "--samples", "2", "--max-new-tokens", "6", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["task", "600", "700"]
    doc = json.loads((out / "ruler.json").read_text())
    assert doc["tasks"] == ["niah_single_1", "niah_multikey_2"] and doc["lengths"] == [600, 700]
    assert doc["haystack"].startswith("stdlib:") and doc["tokenizer"] == {"tokens": 259, "byte_level": True}
    assert len(doc["rows"]) == 4 and len(doc["predictions"]) == 8
    assert all(r["prompt_tokens"] + r["max_new_tokens"] <= r["length"] and r["max_new_tokens"] == 6
               for r in doc["rows"])
    for row in doc["rows"]:
        preds = [p["score"] for p in doc["predictions"] if (p["task"], p["length"]) == (row["task"], row["length"])]
        assert row["score"] == sum(preds) / 2 == doc["scores"][row["task"]][str(row["length"])]
    assert (out / "ruler.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same command again: the same samples and answers (deterministic from the seed)
    first = doc["predictions"]
    assert main(args) == 0
    assert json.loads((out / "ruler.json").read_text())["predictions"] == first
    # a local corpus as the haystack
    (tmp_path / "notes.txt").write_text("A plain line of local text.\n" * 30)
    assert main([*args[:-1], str(tmp_path / "local"), "--corpus", str(tmp_path / "notes.txt")]) == 0
    assert json.loads((tmp_path / "local" / "ruler.json").read_text())["haystack"].startswith("local:")


def test_command_errors_are_one_line_and_write_nothing(tiny_run, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["eval", "ruler", "--checkpoint", str(tiny_run), "--out", str(out)]
    assert main([*base, "--tasks", "niah_single_1", "qa_1"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --tasks qa_1: not a RULER task; allowed values: niah_single_1, niah_single_2, "
                   "niah_single_3, niah_multikey_1, niah_multikey_2, niah_multikey_3, niah_multivalue, "
                   "niah_multiquery, vt, cwe\n")
    assert main([*base, "--tasks", "vt", "niah_single_1", "--lengths", "400", "2048"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --lengths: 400 is too short for vt (needs ") and err.count("\n") == 1
    assert "niah_single_1 (needs " in err
    assert main([*base, "--corpus", str(tmp_path / "missing.txt")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert not out.exists()

