"""StaticDecoder: whole-model decode over static buffers, compiled and CUDA-graph capturable.

    dec = StaticDecoder(model, batch_size=1, max_length=4096)
    logits = dec.prefill(input_ids)         # [B, V] of the last prompt token (the model's chunked prefill)
    dec.capture()                           # CUDA only: one graph per chunk-phase pattern (see below)
    logits = dec.step(next_ids)             # [B, V]; next_ids [B, 1]
    tokens = dec.generate(input_ids, 64)    # greedy, [B, T0 + 64]

Every layer's mixer brings its own static state and one-token step (the mixer contract, layers/base.py:
`init_static_state`, `load_static_state`, `step`); this module only chains them with the norms and MLPs, compiles,
captures and generates. It has no per-mixer code.

Decisions:
- Graphs per chunk phase: a mixer with chunks (NAtS-L, `step_chunk_size()`) does extra work in the step that completes
  a chunk, and takes the host-known flag `chunk_end` (layers/base.py). The host knows every position, so there is one
  graph per pattern of chunk-end flags over the layers (two graphs when all NAtS-L layers share a chunk size:
  inside-chunk and chunk-final; one graph for models without NAtS-L). Inside a graph nothing branches on tensor values.
- The position lives twice: a 0-d long device tensor (read by RoPE, masks and cache writes; advanced in place by the
  captured step) and a host int (`length`) used only for bounds checks and for choosing the graph.
- compile (default: on CUDA): the whole-model step is `torch.compile(fullgraph=True, dynamic=False)`d once per chunk
  phase, before the CUDA-graph capture (`capture()` captures the compiled step; inductor's own cudagraphs are never
  used: `COMPILE_MODE`). Every Triton kernel a step calls is a registered custom op with a fake kernel
  (ops/decode_attention, ops/gated_delta/triton/decode.py, ops/interdomain/triton/decode.py), so inductor traces
  around it. compile=False runs the plain step (the CPU default).
- Fused projections (modules/fused_linear.py): the static states and the decoder keep concatenated copies of the
  weights that read one input (a mixer's input projections, each SwiGLU's gate|up), so a step runs one GEMV where the
  training modules run several (at B = 1 the step is a chain of small kernels; a compiled gdn-340m step went from
  ~19 to ~8 inductor kernels per layer, counted on the CPU). Cost: that extra copy of the fused weights.
- The returned logits are the decoder's static output buffer (as with any CUDA graph): clone them to keep them past
  the next step.
"""

from __future__ import annotations

import math
import types

import torch

from hybrid_attention.layers.base import StaticState, has_static_step
from hybrid_attention.models.mixers import MIXER_BUILDERS
from hybrid_attention.models.modeling import HybridForCausalLM

# torch.compile mode of the step ("default": inductor fusion, fast compile; "max-autotune-no-cudagraphs" adds GEMM
# autotuning at a longer compile). Never a cudagraph mode: capture() captures the compiled step itself.
COMPILE_MODE = "default"


class StaticDecoder:
    """Static-buffer decoder for a `HybridForCausalLM` (inference only; the model's weights must stay fixed).

    batch_size, max_length: sizes of every buffer (max_length counts prompt and generated tokens). device / dtype:
    default to the model's and must equal them (convert the model first). use_kernels: fused Triton decode steps
    (default: on CUDA). natsl_cache_chunks: softmax-typed chunks a NAtS-L layer can keep per (row, decision head)
    (default: all complete chunks of max_length; smaller = an expected softmax fraction, cheaper steps; exceeding it
    is reported by `overflowed()` and makes `generate` raise). compile: `torch.compile` the step (default: on CUDA;
    see the module docstring); compile_mode: its mode.
    """

    def __init__(self, model: HybridForCausalLM, batch_size: int, max_length: int,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 use_kernels: bool | None = None, natsl_cache_chunks: int | None = None,
                 compile: bool | None = None, compile_mode: str = COMPILE_MODE) -> None:
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
        self.use_kernels = w.is_cuda if use_kernels is None else bool(use_kernels)
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
        # chunk size of each layer whose step has chunk ends (NAtS-L; None for the others): the chunk-final steps
        self.chunk_sizes = [mixer.step_chunk_size() for mixer in mixers]
        self.tokens = torch.zeros(batch_size, 1, dtype=torch.long, device=self.device)  # static graph input
        self.logits = torch.zeros(batch_size, model.config.vocab_size, dtype=dtype, device=self.device)
        self.pos = torch.zeros((), dtype=torch.long, device=self.device)
        self.length = 0
        self.graphs: dict[tuple[bool, ...], torch.cuda.CUDAGraph] = {}
        self.compile = self.device.type == "cuda" if compile is None else bool(compile)
        self._run = (torch.compile(self._own_step_impl(), fullgraph=True, dynamic=False, mode=compile_mode)
                     if self.compile else self._step_impl)

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
        """Per layer: does the token at position `length` complete a NAtS-L chunk?"""
        return tuple(c is not None and (length + 1) % c == 0 for c in self.chunk_sizes)

    def _all_phases(self) -> list[tuple[bool, ...]]:
        period = math.lcm(*[c for c in self.chunk_sizes if c is not None]) if any(self.chunk_sizes) else 1
        return sorted({self._phase(p) for p in range(period)})

    def set_length(self, length: int) -> None:
        """Declare that the buffers hold `length` tokens (after `fill_random`; prefill sets it itself)."""
        if not 0 <= length <= self.max_length:
            raise ValueError(f"length must be in [0, max_length={self.max_length}], got {length}")
        self.length = length
        self.pos.fill_(length)

    def overflowed(self) -> bool:
        """True when a NAtS-L layer kept more chunks than `natsl_cache_chunks` (reads device flags: a host sync)."""
        return any(bool(flag) for flag in (st.overflowed() for st in self.states) if flag is not None)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
        """input_ids [B, T0] -> logits [B, V] of the last position. Runs `model.prefill` (chunked, Python-side
        state) and copies every layer's state into the static buffers."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch_size, T0], got shape {tuple(input_ids.shape)}")
        b, t0 = input_ids.shape
        if b != self.batch_size:
            raise ValueError(f"input_ids has batch size {b}, the decoder was built for batch_size={self.batch_size}")
        if not 1 <= t0 <= self.max_length:
            raise ValueError(f"prompt length {t0} must be in [1, max_length={self.max_length}]")
        logits, cache = self.model.prefill(input_ids.to(self.device), chunk_size=chunk_size)
        for blk, static, state in zip(self.model.model.layers, self.states, cache.states):
            blk.mixer.load_static_state(static, state)
        self.set_length(t0)
        self.logits.copy_(logits)
        return self.logits

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
    def _step_impl(self, phase: tuple[bool, ...]) -> None:
        """The capturable (and compiled) step: tokens -> logits, every state buffer advanced in place, pos += 1.
        phase: per layer, does this token complete a chunk (the mixers' `chunk_end` flags)."""
        m = self.model.model
        h = m.embeddings(self.tokens)
        for blk, static, chunk_end, gate_up in zip(m.layers, self.states, phase, self.mlp_weights):
            h = h + blk.mixer.step(blk.attn_norm(h), static, self.pos, chunk_end)
            h = h + blk.mlp.forward_fused(blk.mlp_norm(h), gate_up)
        self.logits.copy_(self.model.lm_head(m.norm(h))[:, 0])
        self.pos.add_(1)

    @torch.no_grad()
    def step(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [B, 1] (the token at position `length`) -> logits [B, V] (static buffer). Replays a captured
        graph when `capture()` was called, else runs the same (compiled or plain) step directly."""
        if tuple(token_ids.shape) != (self.batch_size, 1):
            raise ValueError(f"token_ids must be [batch_size={self.batch_size}, 1], got {tuple(token_ids.shape)}")
        if self.length >= self.max_length:
            raise ValueError(f"max_length={self.max_length} exceeded: the buffers already hold {self.length} tokens")
        self.tokens.copy_(token_ids)
        phase = self._phase(self.length)
        if self.graphs:
            self.graphs[phase].replay()
        else:
            self._run(phase)
        self.length += 1
        return self.logits

    @torch.no_grad()
    def capture(self, warmup: int = 2) -> None:
        """CUDA only: capture one graph per chunk phase. Warm-up runs (torch.compile, Triton compilation, cuBLAS
        workspaces) happen on a side stream; the recurrent states and counters are snapshotted before and restored
        after each of them, so capturing does not change the decoder's state (the large caches are only written at
        the cursor)."""
        if not self.device.type == "cuda":
            raise ValueError(f"capture() needs a CUDA model, got device {self.device}")
        if self.length >= self.max_length:
            raise ValueError(f"max_length={self.max_length} reached: no room for the warm-up step")
        small = [self.pos] + [buf for static in self.states for buf in static.small_buffers()]
        saved = [buf.clone() for buf in small]

        def restore() -> None:
            for buf, old in zip(small, saved):
                buf.copy_(old)

        self.graphs = {}
        pool = None
        side = torch.cuda.Stream(device=self.device)
        for phase in self._all_phases():
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self._run(phase)
                    restore()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._run(phase)
            pool = graph.pool()  # graphs share one memory pool: they never run concurrently
            self.graphs[phase] = graph
        restore()
        torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, chunk_size: int = 2048) -> torch.Tensor:
        """Greedy decoding: prefill, then `max_new_tokens` steps (graphs when captured). Returns [B, T0 + new]."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if input_ids.shape[-1] + max_new_tokens > self.max_length + 1:
            raise ValueError(f"prompt ({input_ids.shape[-1]}) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"max_length={self.max_length} (+ 1: the last token is never fed back)")
        logits = self.prefill(input_ids, chunk_size=chunk_size)
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
