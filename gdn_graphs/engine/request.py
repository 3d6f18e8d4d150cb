"""The embedded engine's configuration and requests, and the checks every request passes before
it is queued (types and ranges: an int that is not a bool, a float or a str; ids in the
vocabulary)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch

from gdn_graphs.constants import CHUNK

__all__ = ["MODES", "mode_available", "EngineConfig", "RequestMetrics", "Request", "as_int",
           "token_ids"]

MODES = ("eager", "piecewise", "full")


def mode_available(mode: str, device) -> tuple[bool, str]:
    """(available, why not). ``full`` needs CUDA; eager and piecewise run anywhere."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    if mode == "full" and torch.device(device).type != "cuda":
        return False, "n/a (no GPU)"
    return True, ""


def as_int(what: str, x) -> int:
    """``x`` as a Python int if it is an integer (int, numpy integer, anything with __index__);
    a bool (True would be token 1), a float (3.7 would become 3) or a str is a TypeError."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int, got bool {x!r}")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(x).__name__} {x!r}") from None


def token_ids(prompt, vocab: int) -> list[int]:
    """The prompt as a list of ints in [0, vocab), or a TypeError / ValueError naming the first
    bad token."""
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Iterable):
        raise TypeError(f"prompt must be a sequence of int token ids, got {type(prompt).__name__}")
    ids = [as_int(f"prompt[{i}]", t) for i, t in enumerate(prompt)]
    if not ids:
        raise ValueError("empty prompt")
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise ValueError(f"prompt[{i}] = {t} is not a token id: the vocabulary is [0, {vocab})")
    return ids


@dataclass
class EngineConfig:
    mode: str = "eager"
    enable_prefix_caching: bool = True
    block_size: int = 64
    num_slots: int = 64
    max_seqs: int = 8               # rows per step
    max_tokens: int = 256           # token budget per step (a multiple of 64)
    max_model_len: int = 4096       # prompt + generated tokens of one request
    decode_buckets: tuple[int, ...] = (1, 2, 4, 8)     # full mode: captured batch sizes
    token_buckets: tuple[int, ...] | None = None       # piecewise padding (default: powers of 2)
    compile_mode: str | None = None  # torch.compile mode; None: "reduce-overhead" on CUDA
    compile_backend: str = "inductor"  # "aot_eager" in CPU tests (no C++ compile)
    debug_record: bool = False      # keep every GDN core output per request (tests)
    debug_ptrs: bool = False        # GraphManager's data_ptr guard
    progress: bool = True           # tqdm bars while capturing graphs
    graph_backend: object = None    # GraphManager backend (tests: a CPU stand-in for CUDA graphs)
    spec: str | None = None         # speculative decoding: None (off) or "ngram" (prompt lookup)
    num_spec_tokens: int = 3        # k: drafts per decoding request and step (spec on)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose from {MODES}")
        if self.block_size % CHUNK or self.block_size < CHUNK:
            raise ValueError(f"block_size must be a positive multiple of {CHUNK}, got "
                             f"{self.block_size}")
        if self.max_tokens % CHUNK or self.max_tokens < CHUNK:
            raise ValueError(f"max_tokens must be a positive multiple of {CHUNK} (prefill steps end "
                             f"on chunk boundaries), got {self.max_tokens}")
        for name in ("max_seqs", "num_slots", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.spec not in (None, "ngram"):
            raise ValueError(f"spec must be None or 'ngram', got {self.spec!r}")
        if self.spec is not None:
            k = self.num_spec_tokens
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < self.block_size:
                raise ValueError(f"num_spec_tokens must be an int in [1, block_size), got {k!r}")
            if self.max_seqs * (k + 1) > self.max_tokens:
                raise ValueError(f"max_seqs * (1 + num_spec_tokens) = {self.max_seqs * (k + 1)} "
                                 f"exceeds max_tokens={self.max_tokens}")
            if self.num_slots <= self.ring_slots:
                raise ValueError(f"num_slots={self.num_slots} leaves none for the prefix cache "
                                 f"once {self.ring_slots} are reserved for the spec rings")

    @property
    def ring_slots(self) -> int:
        """Pool slots reserved for speculative rings (k + 2 per row; 0 with spec off)."""
        return self.max_seqs * (self.num_spec_tokens + 2) if self.spec else 0


@dataclass
class RequestMetrics:
    queried_tokens: int = 0       # prompt tokens looked up in the prefix cache
    hit_tokens: int = 0           # of those, served from cached states
    ttft_s: float = float("nan")  # time to first token (from add_request)
    decode_tok_s: float = float("nan")  # generated tokens after the first / their time
    num_steps: int = 0


@dataclass(eq=False)  # identity: two engines' requests may hold equal fields
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: str = "waiting"       # waiting | running | finished | aborted | error
    error: str | None = None
    t_arrival: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    # debug_record: (start position, [per layer: core output rows for this step's tokens])
    core_trace: list = field(default_factory=list)
    owner: object = field(default=None, repr=False)  # the Engine that queued it
    # speculative decoding: tokens its last step accepted (0: that step was not a spec row),
    # the plan's ``accepted`` for its next row
    accepted: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def tokens_total(self) -> int:
        """Tokens this request can ever compute (the last sampled one is never fed back)."""
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def done(self) -> bool:
        return self.status in ("finished", "aborted", "error")

    def core_outputs(self, layer: int) -> dict[int, torch.Tensor]:
        """debug_record: {absolute position: core output [HV, V]} of one layer."""
        out = {}
        for start, per_layer in self.core_trace:
            for j, row in enumerate(per_layer[layer]):
                out[start + j] = row
        return out
