"""Text generation from a trained model (sampling options of ``transformers``' ``generate``), streamed as produced."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

MAX_NEW_TOKENS = 65536  # the ceiling of ``generate --max-new-tokens`` (cli.MAX_NEW_TOKENS); a model may allow fewer


class PromptError(ValueError):
    """A prompt that cannot be encoded (invalid UTF-8 bytes, lone surrogates); the message is one line."""


def check_prompt(prompt: str) -> None:
    """PromptError naming the first character that is not valid Unicode text: a lone surrogate, which is also how
    Python hands over the bytes of a command-line argument that is not valid UTF-8."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = prompt[e.start]
        what = (f"the byte 0x{ord(bad) - 0xDC00:02x} is not valid UTF-8" if 0xDC80 <= ord(bad) <= 0xDCFF
                else f"a lone surrogate U+{ord(bad):04X}")
        raise PromptError(f"not valid UTF-8 text at character {e.start}: {what}") from None


def prompt_ids(tok: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """The token ids :func:`generate_text` starts from: the document separator (every training document was preceded
    by it), then the prompt."""
    check_prompt(prompt)
    sep = tok.eos_token_id if tok.eos_token_id is not None else tok.bos_token_id
    return ([sep] if sep is not None else []) + tok(prompt, add_special_tokens=False)["input_ids"]


def position_limit(model: torch.nn.Module) -> int | None:
    """Tokens (prompt + continuation) the model is configured for: ``config.max_position_embeddings`` (None: none)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(limit) if limit else None


def max_new_tokens_allowed(model: torch.nn.Module, n_prompt: int) -> int:
    """The most new tokens after ``n_prompt`` prompt tokens: :data:`MAX_NEW_TOKENS`, or less when the model's
    position limit leaves less room (0 when the prompt alone fills it)."""
    limit = position_limit(model)
    return MAX_NEW_TOKENS if limit is None else max(0, min(MAX_NEW_TOKENS, limit - n_prompt))


def _bytes_concatenate(tok: PreTrainedTokenizerBase) -> bool:
    """Whether decoding joins the tokens' bytes and nothing else (a byte-level decoder, no space clean-up), so that the
    text of a token list cut where its decode ends on a whole character is the two halves' texts joined."""
    backend = getattr(tok, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel" and not getattr(tok, "clean_up_tokenization_spaces", False)


class _TextChunks(BaseStreamer):
    """Hands ``write`` each piece of text as soon as it is final: the decode of the new tokens since the last cut,
    held back while it ends in an incomplete UTF-8 sequence (U+FFFD). The pieces concatenate to the decode of all new
    tokens. A byte-level tokenizer is cut after every piece, so decoding stays linear (8,192 random byte tokens: 0.06 s
    on one CPU core, 6.8 s when the whole text is decoded at every token; test_generate_limits.py times it); any other
    tokenizer only after a newline, where decoding restarts cleanly."""

    def __init__(self, tok: PreTrainedTokenizerBase, write: Callable[[str], None]):
        self.tok, self.write = tok, write
        self.cut_anywhere = _bytes_concatenate(tok)
        self.prompt_seen, self.cache, self.done = False, [], 0

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate() hands over the prompt first
            self.prompt_seen = True
            return
        self.cache.extend(int(t) for t in value.flatten().tolist())
        text = self.tok.decode(self.cache, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        if len(text) > self.done:
            self.write(text[self.done :])
        if self.cut_anywhere or text.endswith("\n"):
            self.cache, self.done = [], 0
        else:
            self.done = len(text)

    def end(self) -> None:
        text = self.tok.decode(self.cache, skip_special_tokens=True)
        if len(text) > self.done:
            self.write(text[self.done :])
        self.cache, self.done = [], 0


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
    stream: Callable[[str], None] | None = None,
) -> str:
    """The continuation of ``prompt`` (without the prompt). The prompt is preceded by the document separator, as every
    training document was. ``stream`` (e.g. ``sys.stdout.write``) gets the text piece by piece while it is produced;
    the pieces concatenate to the returned text. Raises PromptError for a prompt that is not valid UTF-8."""
    torch.manual_seed(seed)
    x = torch.tensor([prompt_ids(tok, prompt)], device=device)
    kwargs = dict(do_sample=do_sample, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id)
    if do_sample:
        kwargs.update(temperature=temperature, top_k=top_k, top_p=top_p)
    if stream is not None:
        kwargs["streamer"] = _TextChunks(tok, stream)
    model.eval()
    out = model.generate(x, **kwargs)
    return tok.decode(out[0, x.shape[1] :].tolist(), skip_special_tokens=True)
