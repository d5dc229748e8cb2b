"""StaticDecoder: whole-model decode over static buffers, compiled and CUDA-graph capturable.

Every layer's mixer brings its own static state and one-token step (the mixer contract, layers/base.py:
`init_static_state`, `load_static_state`, `step`); this module only chains them with the norms and MLPs, compiles,
captures and generates. It has no per-mixer code. `StaticDecoder`'s docstring shows the use and names its decisions
(one graph per chunk-phase pattern, device and host positions, per-row positions, compile, fused projections and
GEMVs, the static logits buffer).
"""

from __future__ import annotations

import itertools
import math
import types

import torch

from hybrid_attention.layers.base import StaticState, has_static_step
from hybrid_attention.models.mixers import MIXER_BUILDERS
from hybrid_attention.models.modeling import HybridForCausalLM
from hybrid_attention.models.padding import RowStates, left_padding_lengths
from hybrid_attention.modules.norm import RMSNorm
from hybrid_attention.ops.common.backend import resolve_use_kernels
from hybrid_attention.ops.common.triton import interpreting
from hybrid_attention.ops.decode_linear import MAX_ROWS as DECODE_LINEAR_MAX_ROWS
from hybrid_attention.ops.decode_linear import add_norm_linear, linear_residual, norm_linear

# torch.compile mode of the step ("default": inductor fusion, fast compile; "max-autotune-no-cudagraphs" adds GEMM
# autotuning at a longer compile). Never a cudagraph mode: capture() captures the compiled step itself.
COMPILE_MODE = "default"
# DECISION: the fused decode GEMVs (ops/decode_linear) are opt-in; `benchmarks.profile_decode --fused-gemv` times them
# against inductor + cuBLAS on a GPU. They are tested on the CPU interpreter, and the
# LM-head and down GEMVs run fewer programs than the GPU has SMs (a possible loss to cuBLAS).
FUSED_GEMV_DEFAULT = False


class StaticDecoder:
    """Static-buffer decoder for a `HybridForCausalLM` (inference only; the model's weights must stay fixed).

    batch_size, max_length: sizes of every buffer (max_length counts prompt and generated tokens). device / dtype:
    default to the model's and must equal them (convert the model first). use_kernels: fused Triton decode steps
    (default: on CUDA). natsl_cache_chunks: softmax-typed chunks a NAtS-L layer can keep per (row, decision head)
    (default: all complete chunks of max_length; smaller = an expected softmax fraction, cheaper steps; exceeding it
    is reported by `overflowed()` and makes `generate` raise). compile: `torch.compile` the step (default: on CUDA;
    see "compile" below); compile_mode: its mode. fused_gemv: the MLP halves and the LM head as fused Triton
    GEMVs (ops/decode_linear; needs use_kernels and batch_size <= 8; default off, see FUSED_GEMV_DEFAULT).

    Use:

        dec = StaticDecoder(model, batch_size=1, max_length=4096)
        logits = dec.prefill(input_ids)         # [B, V] of the last prompt token (the model's chunked prefill)
        dec.capture()                           # CUDA only: one graph per chunk-phase pattern (see below)
        logits = dec.step(next_ids)             # [B, V]; next_ids [B, 1]
        tokens = dec.generate(input_ids, 64)    # greedy, [B, T0 + 64]
        tokens = dec.generate(ids, 64, attention_mask=mask)   # prompts of different lengths, left padded

    Decisions:
    - Graphs per chunk phase: a mixer with chunks (NAtS-L, `step_chunk_size()`) does extra work in the step that
      completes a chunk, and takes the host-known flag `chunk_end` (layers/base.py). The host knows every position, so
      there is one graph per pattern of chunk-end flags over the layers (two graphs when all NAtS-L layers share a chunk
      size: inside-chunk and chunk-final; one graph for models without NAtS-L). Inside a graph nothing branches on
      tensor values.
    - The position lives twice: a 0-d long device tensor (read by RoPE, masks and cache writes; advanced in place by the
      captured step) and a host int (`length`) used only for bounds checks and for choosing the graph.
    - Prompts of different lengths (`prefill(..., attention_mask=...)` with left padding, models/padding.py): the rows
      get their own positions, a [B] long device tensor (`row_pos`, advanced in place) beside the host lengths; every
      mixer step takes it instead of the 0-d one (the per-row layout and NAtS-L's per-row chunk ends: layers/base.py).
      It is a second mode with its own compiled step and graphs (`per_row`); equal-length prompts (no mask, or one
      without zeros) use the 0-d path. In the per-row mode a layer's chunk-end flag is "some row completes a
      chunk"; the graphs cover every pattern of those flags over the distinct chunk sizes (two for one size), so one
      `capture()` in the per-row mode serves any later padded prefill. `length` is then the longest row's length (the
      bound of the buffers).
    - compile (default: on CUDA): the whole-model step is `torch.compile(fullgraph=True, dynamic=False)`d once per chunk
      phase, before the CUDA-graph capture (`capture()` captures the compiled step; inductor's own cudagraphs are never
      used: `COMPILE_MODE`). Every Triton kernel a step calls is a registered custom op with a fake kernel
      (ops/decode_attention, ops/gated_delta/triton/decode.py, ops/interdomain/triton/decode.py), so inductor traces
      around it. compile=False runs the plain step (the CPU default).
    - Fused projections (modules/fused_linear.py): the static states and the decoder keep concatenated copies of the
      weights that read one input (a mixer's input projections, each SwiGLU's gate|up), so a step runs one GEMV where
      the training modules run several (at B = 1 the step is a chain of small kernels; a compiled gdn-340m step runs ~8
      inductor kernels per layer instead of ~19, counted on the CPU). Cost: that extra copy of the fused weights.
    - Fused GEMVs (use_kernels, B <= 8, ops/decode_linear): each block's MLP half runs as two Triton launches, the
      mixer's residual add + RMSNorm + gate|up GEMV + SwiGLU (add and norm as the GEMV's prologue, the SwiGLU as its
      epilogue) and down GEMV + residual add, where the compiled plain step runs four (add + norm, GEMV, SiLU·mul, GEMV;
      the down's residual add goes into the next block's norm kernel); the final norm + lm_head is one launch too.
      The mixer half keeps the mixer contract (`step` takes the normed x and runs its own fused input GEMV): fusing the
      attention norm into that GEMV, or the residual into the output projection, would move the norm and the residual
      into every mixer's step, so it is not done here.
    - The returned logits are the decoder's static output buffer (as with any CUDA graph): clone them to keep them past
      the next step.
    """

    def __init__(self, model: HybridForCausalLM, batch_size: int, max_length: int,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 use_kernels: bool | None = None, natsl_cache_chunks: int | None = None,
                 compile: bool | None = None, compile_mode: str = COMPILE_MODE,
                 fused_gemv: bool | None = None) -> None:
        for name, val in (("batch_size", batch_size), ("max_length", max_length)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        if natsl_cache_chunks is not None and (not isinstance(natsl_cache_chunks, int) or natsl_cache_chunks < 0):
            raise ValueError(f"natsl_cache_chunks must be None or an integer >= 0, got {natsl_cache_chunks!r}")
        w = model.lm_head.weight
        device = torch.device(device) if device is not None else w.device
        if device.type != w.device.type or (device.index is not None and device.index != w.device.index):
            raise ValueError(f"device must be the model's device {w.device}, got {device} (move the model first)")
        dtype = dtype or w.dtype
        if dtype != w.dtype:
            raise ValueError(f"dtype must be the model's dtype {w.dtype}, got {dtype} (convert the model first)")
        self.model, self.batch_size, self.max_length = model, batch_size, max_length
        self.natsl_cache_chunks = natsl_cache_chunks
        self.device, self.dtype = w.device, dtype
        self.use_kernels = resolve_use_kernels(use_kernels, "StaticDecoder", w.is_cuda)
        if self.use_kernels and not w.is_cuda and not interpreting():
            raise ValueError(f"use_kernels=True needs a CUDA model or TRITON_INTERPRET=1 (the CPU interpreter); the "
                             f"model is on {w.device} (use_kernels=False runs the PyTorch step)")
        mixers = [blk.mixer for blk in model.model.layers]
        for mixer in mixers:
            if not has_static_step(mixer):
                allowed = sorted({cls.__name__ for cls, _ in MIXER_BUILDERS.values() if has_static_step(cls)})
                names = ", ".join(n for n, (cls, _) in MIXER_BUILDERS.items() if has_static_step(cls))
                raise ValueError(f"mixer type {type(mixer).__name__} has no static decode step; allowed mixer "
                                 f"classes: {allowed} (config.layers names: {names})")
        self.states: list[StaticState] = [
            mixer.init_static_state(batch_size, max_length, self.device, dtype, use_kernels=self.use_kernels,
                                    cache_chunks=natsl_cache_chunks) for mixer in mixers]
        # the SwiGLU gate|up of every block as one weight (modules/fused_linear.py: one GEMV instead of two per step;
        # an extra copy of those weights, made once: the weights are frozen while serving)
        self.mlp_weights = [blk.mlp.decode_weights().to(device=self.device, dtype=dtype) for blk in model.model.layers]
        # use_kernels at decode batch sizes: each block's MLP half as two launches (ops/decode_linear: the mixer's
        # residual add + RMSNorm + gate|up GEMV + SwiGLU, then down GEMV + residual), the final norm + lm_head as one
        norms = [blk.mlp_norm for blk in model.model.layers] + [model.model.norm]
        fused_gemv = FUSED_GEMV_DEFAULT if fused_gemv is None else bool(fused_gemv)
        self.fused_mlp = (fused_gemv and self.use_kernels and batch_size <= DECODE_LINEAR_MAX_ROWS
                          and all(type(n) is RMSNorm and n.weight is not None for n in norms)
                          and model.lm_head.bias is None)
        # chunk size of each layer whose step has chunk ends (NAtS-L; None for the others): the chunk-final steps
        self.chunk_sizes = [mixer.step_chunk_size() for mixer in mixers]
        self.tokens = torch.zeros(batch_size, 1, dtype=torch.long, device=self.device)  # static graph input
        self.logits = torch.zeros(batch_size, model.config.vocab_size, dtype=dtype, device=self.device)
        self.pos = torch.zeros((), dtype=torch.long, device=self.device)
        self.row_pos = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # per-row mode: [B] positions
        self.length = 0
        # per-row mode (a left-padded prefill): row b holds length - row_pad[b] tokens; None: rows of equal length
        self.row_pad: list[int] | None = None
        self.graphs: dict[tuple[bool, tuple[bool, ...]], torch.cuda.CUDAGraph] = {}  # (per_row, phase) -> graph
        self.compile = self.device.type == "cuda" if compile is None else bool(compile)
        # one compiled step per mode (each its own code object: the 0-d and [B] positions never share Dynamo's cache)
        self._run, self._run_rows = (
            (torch.compile(self._own_step_impl(), fullgraph=True, dynamic=False, mode=compile_mode),
             torch.compile(self._own_step_impl(), fullgraph=True, dynamic=False, mode=compile_mode))
            if self.compile else (self._step_impl, self._step_impl))

    @property
    def per_row(self) -> bool:
        """Whether the rows have their own lengths (after a left-padded prefill)."""
        return self.row_pad is not None

    def _own_step_impl(self):
        """`_step_impl` bound to this decoder through its own code object. Dynamo keeps its compiled graphs per code
        object, guarded on `self` and every buffer shape: with one shared code object the 9th decoder of a process
        (another batch size or max_length) would hit `recompile_limit` (8), a hard error under fullgraph=True. Each
        decoder's graphs belong to it and go with it."""
        f = StaticDecoder._step_impl
        own = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
        return types.MethodType(own, self)

    # ------------------------------------------------------------------------------------------------ state
    def _phase(self, length: int) -> tuple[bool, ...]:
        """Per layer: does the token at position `length` complete a NAtS-L chunk? Per-row mode: does it in some row
        (row b is at position length - row_pad[b])?"""
        pads = self.row_pad or [0]
        return tuple(c is not None and any((length - p + 1) % c == 0 for p in pads) for c in self.chunk_sizes)

    def _all_phases(self, per_row: bool = False) -> list[tuple[bool, ...]]:
        """Every phase a step can have: over one period of the chunk sizes; per_row: every pattern of flags over the
        distinct chunk sizes (rows at any phases)."""
        if per_row:
            sizes = sorted({c for c in self.chunk_sizes if c is not None})
            patterns = (dict(zip(sizes, ends)) for ends in itertools.product((False, True), repeat=len(sizes)))
            return sorted({tuple(c is not None and ends[c] for c in self.chunk_sizes) for ends in patterns})
        period = math.lcm(*[c for c in self.chunk_sizes if c is not None]) if any(self.chunk_sizes) else 1
        return sorted({self._phase(p) for p in range(period)})

    def set_length(self, length: int) -> None:
        """Declare that the buffers hold `length` tokens in every row (after `fill_random`; prefill sets it itself)."""
        if not 0 <= length <= self.max_length:
            raise ValueError(f"length must be in [0, max_length={self.max_length}], got {length}")
        self.length = length
        self.row_pad = None
        self.pos.fill_(length)

    def overflowed(self) -> bool:
        """True when a NAtS-L layer kept more chunks than `natsl_cache_chunks` (reads device flags: a host sync)."""
        return any(bool(flag) for flag in (st.overflowed() for st in self.states) if flag is not None)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, chunk_size: int = 2048,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, T0] -> logits [B, V] of the last position. Runs `model.prefill` (chunked, Python-side
        state) and copies every layer's state into the static buffers. attention_mask [B, T0] (left padding,
        models/padding.py): prompts of different lengths; with a zero in it the decoder runs in the per-row mode
        (class docstring) until the next prefill; without one it is ignored."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch_size, T0], got shape {tuple(input_ids.shape)}")
        b, t0 = input_ids.shape
        if b != self.batch_size:
            raise ValueError(f"input_ids has batch size {b}, the decoder was built for batch_size={self.batch_size}")
        lens = self._row_lengths(input_ids, attention_mask)
        longest = t0 if lens is None else max(lens)
        if not 1 <= longest <= self.max_length:
            raise ValueError(f"prompt length {longest} must be in [1, max_length={self.max_length}]")
        if lens is None:
            logits, cache = self.model.prefill(input_ids.to(self.device), chunk_size=chunk_size)
        else:
            logits, cache = self.model.prefill(input_ids.to(self.device), chunk_size=chunk_size,
                                               attention_mask=attention_mask.to(self.device))
        for blk, static, state in zip(self.model.model.layers, self.states, cache.states):
            if isinstance(state, RowStates):  # a mixer without packed states: one batch-1 state per row
                for row, row_state in enumerate(state.rows):
                    blk.mixer.load_static_state(static.row(row), row_state)
            else:
                blk.mixer.load_static_state(static, state)
        self.set_length(longest)
        if lens is not None:
            self.row_pad = [longest - n for n in lens]
            self.row_pos.copy_(torch.tensor(lens, dtype=torch.long))
        self.logits.copy_(logits)
        return self.logits

    @staticmethod
    def _row_lengths(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[int] | None:
        """The prompt lengths of a left-padded attention_mask [B, T0] (host ints), or None without padding."""
        if attention_mask is None:
            return None
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got "
                             f"{tuple(attention_mask.shape)}")
        lens = left_padding_lengths(attention_mask)
        return None if lens is None else lens.tolist()

    @torch.no_grad()
    def fill_random(self, length: int, softmax_fraction: float = 0.5, seed: int = 0) -> None:
        """Timing only: random states / K/V as if `length` tokens had been seen (NAtS-L: every row and decision head
        keeps round(softmax_fraction · complete chunks) chunks). Outputs are meaningless; costs are those of a real
        context of that length."""
        if not 0.0 <= softmax_fraction <= 1.0:
            raise ValueError(f"softmax_fraction must be in [0, 1], got {softmax_fraction}")
        if not 0 <= length <= self.max_length:
            raise ValueError(f"length must be in [0, max_length={self.max_length}], got {length}")
        gen = torch.Generator(self.device).manual_seed(seed)  # a private generator: the global RNG is untouched
        for static in self.states:
            static.fill_random(length, gen, softmax_fraction=softmax_fraction)
        self.set_length(length)

    # ------------------------------------------------------------------------------------------------ step
    def _step_impl(self, phase: tuple[bool, ...], per_row: bool = False) -> None:
        """The capturable (and compiled) step: tokens -> logits, every state buffer advanced in place, pos += 1.
        phase: per layer, does this token complete a chunk (in some row, per_row) (the mixers' `chunk_end` flags);
        per_row: the [B] positions `row_pos` instead of the 0-d `pos`."""
        m = self.model.model
        pos = self.row_pos if per_row else self.pos
        h = m.embeddings(self.tokens)
        for blk, static, chunk_end, gate_up in zip(m.layers, self.states, phase, self.mlp_weights):
            y = blk.mixer.step(blk.attn_norm(h), static, pos, chunk_end)
            if self.fused_mlp:  # h + y, its norm, gate|up and SwiGLU: one launch; down + residual: one
                h2, a = add_norm_linear(y[:, 0], h[:, 0], blk.mlp_norm.weight, gate_up, blk.mlp_norm.eps, "swiglu",
                                        backend="triton")
                h = linear_residual(a, blk.mlp.down_proj.weight, h2, backend="triton")[:, None]
            else:
                h = h + y
                h = h + blk.mlp.forward_fused(blk.mlp_norm(h), gate_up)
        if self.fused_mlp:
            self.logits.copy_(norm_linear(h[:, 0], m.norm.weight, self.model.lm_head.weight, m.norm.eps,
                                          backend="triton"))
        else:
            self.logits.copy_(self.model.lm_head(m.norm(h))[:, 0])
        pos.add_(1)

    def _call(self, phase: tuple[bool, ...], per_row: bool) -> None:
        """The (compiled or plain) step of the mode."""
        if per_row:
            self._run_rows(phase, True)
        else:
            self._run(phase)

    @torch.no_grad()
    def step(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [B, 1] (the token at position `length`) -> logits [B, V] (static buffer). Replays a captured
        graph when `capture()` was called, else runs the same (compiled or plain) step directly."""
        if tuple(token_ids.shape) != (self.batch_size, 1):
            raise ValueError(f"token_ids must be [batch_size={self.batch_size}, 1], got {tuple(token_ids.shape)}")
        if self.length >= self.max_length:
            raise ValueError(f"max_length={self.max_length} exceeded: the buffers already hold {self.length} tokens")
        self.tokens.copy_(token_ids)
        key = (self.per_row, self._phase(self.length))
        if self.graphs:
            if key not in self.graphs:
                mode = "per-row (padded prompts)" if self.per_row else "equal-length"
                raise ValueError(f"no CUDA graph for the {mode} mode: call capture() after this prefill")
            self.graphs[key].replay()
        else:
            self._call(key[1], key[0])
        self.length += 1
        return self.logits

    @torch.no_grad()
    def capture(self, warmup: int = 2, per_row: bool | None = None) -> None:
        """CUDA only: capture one graph per chunk phase of a mode (per_row: the per-row mode of padded prompts;
        None: the current mode); graphs of the other mode are kept. Warm-up runs (torch.compile, Triton compilation,
        cuBLAS workspaces) happen on a side stream; the recurrent states and counters are snapshotted before and
        restored after each of them, so capturing does not change the decoder's state (the large caches are only
        written at the cursor). Capturing the other mode than the current one snapshots every buffer (the caches
        too: its step writes at its own cursors, e.g. a NAtS-L chunk slot another row still reads)."""
        if not self.device.type == "cuda":
            raise ValueError(f"capture() needs a CUDA model, got device {self.device}")
        if self.length >= self.max_length:
            raise ValueError(f"max_length={self.max_length} reached: no room for the warm-up step")
        per_row = self.per_row if per_row is None else bool(per_row)
        other = per_row != self.per_row
        if other:  # the other mode's positions may be stale (unused until a prefill sets them): warm up in range
            (self.row_pos if per_row else self.pos).fill_(self.length)
        small = [self.pos, self.row_pos] + [buf for static in self.states
                                            for buf in (static.buffers() if other else static.small_buffers())]
        saved = [buf.clone() for buf in small]

        def restore() -> None:
            for buf, old in zip(small, saved):
                buf.copy_(old)

        self.graphs = {key: g for key, g in self.graphs.items() if key[0] != per_row}
        pool = next(iter(self.graphs.values())).pool() if self.graphs else None
        side = torch.cuda.Stream(device=self.device)
        for phase in self._all_phases(per_row):
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self._call(phase, per_row)
                    restore()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._call(phase, per_row)
            pool = graph.pool()  # graphs share one memory pool: they never run concurrently
            self.graphs[(per_row, phase)] = graph
        restore()
        torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, chunk_size: int = 2048,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy decoding: prefill, then `max_new_tokens` steps (graphs when captured). Returns [B, T0 + new] (the
        padding of a left-padded input_ids stays in front). attention_mask [B, T0]: left padding (`prefill`)."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        lens = self._row_lengths(input_ids, attention_mask) if input_ids.dim() == 2 else None
        longest = input_ids.shape[-1] if lens is None else max(lens)
        if longest + max_new_tokens > self.max_length + 1:
            raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"max_length={self.max_length} (+ 1: the last token is never fed back)")
        logits = self.prefill(input_ids, chunk_size=chunk_size, attention_mask=attention_mask)
        out = [input_ids.to(self.device)]
        for i in range(max_new_tokens):
            nxt = logits.argmax(-1, keepdim=True)
            out.append(nxt)
            if i + 1 < max_new_tokens:
                logits = self.step(nxt)
        if self.overflowed():
            raise RuntimeError(f"a NAtS-L layer kept more than natsl_cache_chunks={self.natsl_cache_chunks} chunks "
                               "in a row / decision head: outputs are not valid; use a larger natsl_cache_chunks")
        return torch.cat(out, 1)
