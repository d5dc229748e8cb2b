"""generate: bounded --max-new-tokens, streamed output equal to the whole text, one line for a prompt that is not
UTF-8; eval length: one note (not a traceback) when the plot cannot be written beside the model."""

import os
import subprocess
import sys
import time

import pytest
import torch

import hybrid_attention.cli as cli
from hybrid_attention.cli import main
from hybrid_attention.data.tokenizer import byte_tokenizer
from hybrid_attention.evaluation import generation
from hybrid_attention.evaluation.generation import _TextChunks, generate_text
from hybrid_attention.evaluation.loading import load_model


def _err_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_the_documented_maximum_is_one_line_before_loading(capsys):
    assert cli.MAX_NEW_TOKENS == generation.MAX_NEW_TOKENS
    assert main(["generate", "--checkpoint", "/nonexistent/run", "--max-new-tokens", "1000000000"]) == 2
    (line,) = _err_lines(capsys)
    assert "--max-new-tokens: must be <= 65536, got 1000000000" in line


def test_the_position_limit_caps_max_new_tokens(tiny_run, capsys):
    limit = load_model(tiny_run).model.config.max_position_embeddings
    assert main(["generate", "--checkpoint", str(tiny_run), "--prompt", "abc", "--max-new-tokens", str(limit)]) == 2
    (line,) = _err_lines(capsys)
    assert line == (f"error: --max-new-tokens {limit}: at most {limit - 4} for this model and prompt "
                    f"(max_position_embeddings {limit} minus the prompt's 4 tokens)")
    assert capsys.readouterr().out == ""
    assert main(["generate", "--checkpoint", str(tiny_run), "--prompt", "x" * limit]) == 2
    (line,) = _err_lines(capsys)
    assert line.startswith(f"error: --prompt: {limit + 1} tokens (with the separator) fill the model's position limit")


@pytest.mark.parametrize("sample", [False, True])
def test_streamed_pieces_make_the_whole_text(tiny_run, capsys, sample):
    loaded = load_model(tiny_run)
    pieces: list[str] = []
    args = (loaded.model, loaded.tokenizer, "def f(x):", 40, sample)
    streamed = generate_text(*args, seed=3, stream=pieces.append)
    assert len(pieces) > 1 and "".join(pieces) == streamed == generate_text(*args, seed=3)
    argv = ["generate", "--checkpoint", str(tiny_run), "--prompt", "def f(x):", "--max-new-tokens", "40", "--seed", "3"]
    assert main(argv + ([] if sample else ["--greedy"])) == 0
    assert capsys.readouterr().out == "def f(x):" + streamed + "\n"


def test_incomplete_utf8_is_held_back():
    tok = byte_tokenizer()
    text = "é€x\ny 😀"
    pieces: list[str] = []
    chunks = _TextChunks(tok, pieces.append)
    chunks.put(torch.tensor([[257]]))  # the prompt
    for b in text.encode("utf-8"):
        chunks.put(torch.tensor([b]))
    chunks.end()
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


def test_prompt_that_is_not_utf8_is_one_line(tiny_run, capsys):
    proc = subprocess.run([sys.executable, "-m", "hybrid_attention.cli", "generate", "--checkpoint", str(tiny_run),
                           "--prompt", b"ab\xff\xfe", "--max-new-tokens", "2"], capture_output=True, timeout=300)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == b"", proc
    assert err == ["error: --prompt: not valid UTF-8 text at character 2: the byte 0xff is not valid UTF-8"]
    assert main(["generate", "--checkpoint", str(tiny_run), "--prompt", "a\ud800b", "--max-new-tokens", "2"]) == 2
    assert _err_lines(capsys) == ["error: --prompt: not valid UTF-8 text at character 1: a lone surrogate U+D800"]


LENGTH = ["eval", "length", "--tokens", "256", "--multipliers", "1", "2", "--device", "cpu"]


def test_length_plot_in_a_read_only_model_folder_is_a_note(tiny_run, capsys, monkeypatch):
    import hybrid_attention.evaluation.length_sweep as length_sweep

    def refuse(results, path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(length_sweep, "plot_length_sweep", refuse)
    assert main(LENGTH + ["--checkpoint", str(tiny_run)]) == 0
    captured = capsys.readouterr()
    assert "ppl" in captured.out.lower()  # the table is the result
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("note: plot not written: cannot write ") and "--out" in err[0]
    assert "Permission denied" in err[0]
    assert not (tiny_run / "length_sweep.png").exists() and not (tiny_run / "final" / "length_sweep.png").exists()


def test_length_out_that_cannot_be_written_is_one_line_before_the_sweep(tiny_run, tmp_path, capsys, monkeypatch):
    import hybrid_attention.evaluation.length_sweep as length_sweep

    def never(*args, **kwargs):
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(length_sweep, "length_sweep", never)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(LENGTH + ["--checkpoint", str(tiny_run), "--out", str(blocker / "plots")]) == 2
    assert _err_lines(capsys) == [f"error: --out {blocker / 'plots'}: {blocker} is not a folder"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_closed_pipe_stops_generation_quietly(tiny_run):
    proc = subprocess.Popen([sys.executable, "-m", "hybrid_attention.cli", "generate", "--checkpoint", str(tiny_run),
                             "--prompt", "x", "--max-new-tokens", "50"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first token (``generate ... | head -c 0``)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0 and err == ""


def test_an_ascii_terminal_gets_escapes_not_a_traceback(tiny_run):
    proc = subprocess.run([sys.executable, "-m", "hybrid_attention.cli", "generate", "--checkpoint", str(tiny_run),
                           "--prompt", "café", "--max-new-tokens", "3", "--greedy"], capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and proc.stderr == b"", proc
    assert proc.stdout.startswith(b"caf\\xe9")


@pytest.mark.parametrize("tokenizer", ["byte", "configs/tokenizers/prose-bpe8192"])
def test_pieces_of_any_token_stream_join_to_its_decode_in_linear_time(tokenizer):
    from pathlib import Path

    from hybrid_attention.data.tokenizer import load_tokenizer

    tok = byte_tokenizer() if tokenizer == "byte" else load_tokenizer(Path(__file__).parents[2] / tokenizer)
    ids = torch.randint(0, len(tok), (8192,), generator=torch.Generator().manual_seed(0)).tolist()
    pieces: list[str] = []
    chunks = _TextChunks(tok, pieces.append)
    chunks.put(torch.tensor([[0]]))  # the prompt
    start = time.monotonic()
    for i in ids:
        chunks.put(torch.tensor([i]))
    chunks.end()
    assert time.monotonic() - start < 3.0  # linear: decoding the whole text at every token is quadratic
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) and len(pieces) > 1000


def test_length_plot_is_never_half_written(tiny_run, tmp_path, capsys, monkeypatch):
    import errno

    import hybrid_attention.evaluation.length_sweep as length_sweep

    def disk_full(results, path, *args, **kwargs):
        path.write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    out = tmp_path / "plots"
    assert main(LENGTH + ["--checkpoint", str(tiny_run), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["length_sweep.png"]
    (out / "length_sweep.png").unlink()
    monkeypatch.setattr(length_sweep, "plot_length_sweep", disk_full)
    capsys.readouterr()
    assert main(LENGTH + ["--checkpoint", str(tiny_run), "--out", str(out)]) == 2
    assert _err_lines(capsys) == [f"error: --out {out}: cannot write length_sweep.png (No space left on device)"]
    assert list(out.iterdir()) == []
