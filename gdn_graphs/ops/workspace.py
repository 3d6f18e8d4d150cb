"""What gdn_chunk_prefill is given besides its tensors: a workspace and launch knobs.

ChunkWorkspace holds the intermediates that the chunk-parallel kernel writes and the sequential
kernel reads, within one call, so one workspace (sized for the largest step) serves every layer;
allocate it once, outside a CUDA graph. ChunkConfig holds the launch knobs of the two kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.common import FLOAT_DTYPES, fail

__all__ = ["ChunkWorkspace", "check_workspace", "ChunkConfig", "DEFAULT_CONFIG", "MANY_SEQS_CONFIG",
           "FEW_PAIRS_CONFIG", "chunk_config"]


class ChunkWorkspace:
    """Persistent intermediates of gdn_chunk_prefill for up to ``max_tokens`` tokens.

    Per token: T' [HV, 64] (its row of its chunk's (I + A)^-1 diag(beta)), P [HV, 64] (the decayed
    causal q.k row of its chunk; not written where the Gluon sequential kernel makes P itself,
    GLUON_CONFIG), the chunk-local cumsum of g [HV] (fp32), and the normalised q and
    k of each key head ([HK, K] each; pass ``HK`` to size them, default room for HK = HV).
    ``dtype`` is the input dtype of q, k, v; all but the cumsum are kept in it. That is
    max_tokens * (HV * 128 + 2 * HK * K) elements plus max_tokens * HV floats; nothing of size
    T/64 * HV * V * K. The workspace only carries data between the two kernels of one call, so
    one serves every layer.
    """

    def __init__(self, max_tokens, HV, K, V, dtype, device, HK=None):
        if dtype not in FLOAT_DTYPES:
            fail("ChunkWorkspace", f"dtype must be one of {FLOAT_DTYPES}, got {dtype}")
        HK = HV if HK is None else HK
        if max_tokens < 1 or min(HV, K, V, HK) < 1 or HK > HV:
            fail("ChunkWorkspace", f"need max_tokens, HV, K, V >= 1 and 1 <= HK <= HV, got "
                 f"{max_tokens}, {HV}, {K}, {V}, HK={HK}")
        self.max_tokens, self.HV, self.K, self.V, self.HK = int(max_tokens), int(HV), int(K), int(V), int(HK)
        self.dtype, self.device = dtype, torch.device(device)
        n = self.max_tokens
        mk = dict(dtype=dtype, device=device)
        self.t = torch.empty(n, HV, CHUNK, **mk)
        self.p = torch.empty(n, HV, CHUNK, **mk)
        self.g = torch.empty(n, HV, dtype=torch.float32, device=device)
        self.qs = torch.empty(n, HK, K, **mk)  # used as [T, HK_actual, K], HK_actual <= HK
        self.kn = torch.empty(n, HK, K, **mk)
        # a gdn_graphs.ops.fi_prefill.FiWorkspace when the engine runs prefill on FlashInfer's
        # kernel where it can (run_gdn_core routes each step: fi_route); None: always ours
        self.fi = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.t, self.p, self.g, self.qs, self.kn))


def check_workspace(fn: str, ws, T: int, HK: int, HV: int, K: int, V: int, dtype, device):
    """``ws`` is a ChunkWorkspace that holds T tokens of inputs [T, HK, K] / [T, HV, V] of
    ``dtype`` on ``device`` (metadata only)."""
    if not isinstance(ws, ChunkWorkspace):
        fail(fn, "workspace must be a ChunkWorkspace")
    if (ws.HV, ws.K, ws.V) != (HV, K, V) or ws.HK < HK or ws.dtype != dtype or ws.max_tokens < T:
        fail(fn, f"workspace (max_tokens={ws.max_tokens}, HV={ws.HV}, HK<={ws.HK}, K={ws.K}, "
             f"V={ws.V}, {ws.dtype}) does not fit T={T}, HV={HV}, HK={HK}, K={K}, V={V}, {dtype}")
    if ws.t.device != device:
        fail(fn, f"workspace is on {ws.t.device}, inputs on {device}")


@dataclass(frozen=True)
class ChunkConfig:
    """Launch knobs (no autotuning: the kernels write the pool in place, so they must run once).

    bv: V tile of the sequential kernel (programs per sequence and head = V / bv).
    warps_intra / warps_seq: num_warps of the two kernels. stages: software-pipelining depth of the
    sequential kernel's chunk loop. dot_precision: input precision of the dots when the inputs are
    fp32 (None: "tf32x3", about fp32 accuracy on tensor cores; "ieee" is exact but spills
    registers). inv_precision: of the in-chunk inverse, on fp32 values (None: "tf32x3" for fp32
    inputs, "tf32" otherwise). The interpreter always computes in fp32. seq_kernel: "triton"
    (chunk.py's, everywhere) or "gluon" (chunk_gluon.py's: Hopper, bf16 inputs, K = V = 128;
    bv 64 or 128 rows of V a CTA, its warps and stages fixed by bv); both give the same bits.

    Defaults and limits, from sweeps on an H200: bv 32 with 4 warps and 3 stages was the fastest
    config for bf16 inputs with one sequence at HV 32 (8 intra warps were slower); with several
    sequences bv 64 is (MANY_SEQS_CONFIG), with 16 or fewer (sequence, value head) pairs bv 16
    (FEW_PAIRS_CONFIG; both picked by chunk_config). fp32 inputs need twice the shared memory
    per stage and 3 stages do not fit in an H200's 227 KB, so ``stages=None`` means 3 for 16-bit
    inputs and 2 for fp32. ``stages=1`` is refused: with Triton 3.6 on an H200 it gave wrong
    outputs (and once an illegal memory access), while every pipelined config matched the default
    bit for bit. (Measurements: profiling/results/2026-11-29/SUMMARY.md, "Chunked prefill".)
    """

    bv: int = 32
    warps_intra: int = 4
    warps_seq: int = 4
    stages: int | None = None
    dot_precision: str | None = None
    inv_precision: str | None = None
    seq_kernel: str = "triton"

    def __post_init__(self):
        if self.seq_kernel not in ("triton", "gluon"):
            fail("ChunkConfig", f"seq_kernel must be 'triton' or 'gluon', got {self.seq_kernel!r}")
        bvs = (64, 128) if self.seq_kernel == "gluon" else (16, 32, 64)
        if self.bv not in bvs:
            fail("ChunkConfig", f"bv of the {self.seq_kernel} sequential kernel must be one of {bvs}, "
                 f"got {self.bv}")
        for name in ("warps_intra", "warps_seq"):
            if getattr(self, name) not in (4, 8):
                fail("ChunkConfig", f"{name} must be 4 or 8, got {getattr(self, name)}")
        if self.stages not in (None, 2, 3):
            fail("ChunkConfig", f"stages must be None, 2 or 3 (1 miscompiles, see the docstring), "
                 f"got {self.stages}")
        for name in ("dot_precision", "inv_precision"):
            if getattr(self, name) not in (None, "ieee", "tf32", "tf32x3"):
                fail("ChunkConfig", f"{name} must be None, 'ieee', 'tf32' or 'tf32x3'")

    def stages_for(self, dtype: torch.dtype) -> int:
        """Pipelining depth for inputs of ``dtype`` (see the class docstring)."""
        if self.stages is not None:
            return self.stages
        return 2 if dtype == torch.float32 else 3


DEFAULT_CONFIG = ChunkConfig()


MANY_SEQS_CONFIG = ChunkConfig(bv=64)
"""For steps of two or more prefill sequences with 16-bit inputs: a V tile of 64 halves the
programs that re-read each chunk's q, k, T' and P. On an H200 (HV 32 / 16, bf16, a state every
256 tokens; profiling/results/2026-12-02/SUMMARY.md) it was the fastest config at 2 x 4096,
8 x 2048, 32 x 512 and 4 x 16384 at both TP 1 and TP 2 (1.16-1.25x the default), and slower
with one sequence, whose 32 or 16 heads give too few programs to fill the SMs (0.88x / 0.83x)."""


FEW_PAIRS_CONFIG = ChunkConfig(bv=16)
"""For a step with 16-bit inputs whose (prefill sequence, value head) pairs are at most
FEW_PAIRS_MAX, e.g. one sequence at TP 2 and up for Qwen3-Next / Qwen3.5 (HV <= 16): the
sequential pass is latency-bound there (one chunk after another), and a V tile of 16 gives 8
programs a pair (128 at 16 pairs) where the default gives 4 (64 on an H100's 132 SMs). On an H100
(HV 16, bf16, a state every 256 tokens, replayed from a CUDA graph;
profiling/results/2026-12-08/SUMMARY.md) the whole prefill of one sequence took 0.259 against
0.294 ms at 8,192 tokens and 0.973 against 1.107 ms at 32,768 (1.13-1.14x); with one sequence at
HV 32 (32 pairs) it was slower (0.69x: 256 programs with 157 KB of shared memory each for their
three stages, one an SM, so two waves), so the default stays there."""

FEW_PAIRS_MAX = 16


GLUON_CONFIG = ChunkConfig(seq_kernel="gluon", bv=64)
"""For steps of two or more prefill sequences whose rows times value heads reach GLUON_MIN_PAIRS,
where the Gluon kernel can run (chunk_gluon.gluon_seq_supported): two CTAs per (sequence, head),
each with 64 rows of V, the state as wgmma's register operand, P made from the chunk's q and k,
and a loader warp group feeding the chain; two CTAs an SM (105 KB of shared memory and 128
registers a thread each). On an H100 (HV 32 / 16, bf16, a state every 256 tokens) the kernel
alone ran 1.34-1.44x Triton's (MANY_SEQS_CONFIG) at 8 x 2048, 4 x 16384 and 32 x 512, and the
whole prefill 1.13-1.30x at 32 to 256 pairs (profiling/results/2026-12-07/SUMMARY.md, thirty-third
stop; without the loader it was 0.99-1.04x at 32 and 64 pairs)."""

GLUON_MIN_PAIRS = 32  # (sequence, value head) pairs; the fewest measured (one sequence of 8,192
# at HV 32: 1.19x MANY_SEQS_CONFIG); below it Triton's kernel, untimed against the Gluon one


def chunk_config(num_seqs: int | None, dtype: torch.dtype, HV: int | None = None,
                 gluon_ok: bool = False) -> ChunkConfig:
    """The launch knobs for a prefill of ``num_seqs`` sequences (a host count; None where it is
    not known, as in a CUDA-graph template) with inputs of ``dtype`` and HV value heads;
    gluon_ok: whether the Gluon sequential kernel can run for this call
    (chunk_gluon.gluon_seq_supported). Every config computes the same bits (V tiles are
    independent columns of the same products; the Gluon kernel repeats the Triton kernel's
    arithmetic: GPU tests), so the choice changes speed only, never a stored state: warm == cold
    holds across steps that chose differently. An engine's warm-up must launch each
    (gdn_graphs.vllm.warmup does)."""
    if num_seqs is None or num_seqs < 1 or dtype == torch.float32:
        return DEFAULT_CONFIG  # (fp32 inputs: other tiles were never timed for them)
    pairs = None if HV is None else num_seqs * HV
    if pairs is not None and pairs <= FEW_PAIRS_MAX:
        return FEW_PAIRS_CONFIG
    if num_seqs == 1:
        return DEFAULT_CONFIG
    if gluon_ok and pairs is not None and pairs >= GLUON_MIN_PAIRS:
        return GLUON_CONFIG
    return MANY_SEQS_CONFIG
