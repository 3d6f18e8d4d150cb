"""Spec rows placed from the device's computed-token counts (vLLM's async scheduling).

With async scheduling vLLM schedules step t + 1 before step t's verification is known: the host's
computed-token count of a request whose step t verified drafts assumes every draft was accepted
(optimistic), and the true count exists only on the device (vLLM's model runner corrects its
``seq_lens`` there from step t's accepted counts). In the lookahead layout (README "Conventions")
where a spec row reads and stores its states depends on that count, so the host plans the step
with its counts (row kinds, lengths, padding, prefill rows: none of these depend on it) and this
kernel then rewrites the spec rows' read and write *placeholders* (``DeviceTablePlanner``: row i,
column c is ``i * stride + c``) from the device's ``seq_lens``; the planner's one gather turns them
into block ids as before. Rows that are not spec rows keep the host's plan: their counts are exact
(a prefill row never follows a step with drafts).

One launch of ``rows`` programs, no host sync, no allocation: it writes the planner's persistent
buffers in place, so it runs inside or outside a CUDA graph alike.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.common import ERR_META_C, ERR_TOKENS_C, report

__all__ = ["place_spec_rows"]

# a compiled kernel reads module globals only as constexprs (the interpreter reads any global,
# which is how a plain NO_SLOT here passed the CPU tier and failed on an H200)
_NO_SLOT = tl.constexpr(NO_SLOT)


@triton.jit
def _lookahead_col(m, B, R):
    """gdn_graphs.runtime.step.lookahead_column: the column of the state after m >= 1 tokens."""
    c = m // B
    return tl.where(m % B == 0, c - 1, c + 1 + (m - c) % R)


# the ints are not specialised on (Triton would compile again for a stride, width or block size
# of another divisibility than the warm-up's: README "Conventions", nothing compiles after
# start-up)
@triton.jit(do_not_specialize=["stride", "width", "B", "R"])
def _place_spec_rows_kernel(seq_lens, spec_cu, spec_read, spec_write, error_flag, stride, width,
                            B, R, L: tl.constexpr,
                            BLOCK_L: tl.constexpr, HAS_FLAG: tl.constexpr):
    i = tl.program_id(0)
    q = tl.load(spec_cu + i + 1) - tl.load(spec_cu + i)
    n = tl.load(seq_lens + i) - q
    bad_tokens = (n < 0) | (q < 1) | (q > L)
    report(error_flag, bad_tokens, ERR_TOKENS_C, HAS_FLAG)
    base = i * stride
    rcol = _lookahead_col(tl.maximum(n, 1), B, R)
    bad_read = (n > 0) & (rcol >= width)
    read = tl.where((n > 0) & ~bad_read & ~bad_tokens, base + rcol, _NO_SLOT)
    tl.store(spec_read + i, read)
    t = tl.arange(0, BLOCK_L)
    m = tl.maximum(n, 0) + 1 + t
    wcol = _lookahead_col(m, B, R)
    live = t < q
    bad_write = live & (wcol >= width)
    write = tl.where(live & ~bad_write & ~bad_tokens, base + wcol, _NO_SLOT)
    tl.store(spec_write + i * L + t, write, mask=t < L)
    report(error_flag, bad_read | (tl.sum(bad_write.to(tl.int32), axis=0) > 0), ERR_META_C,
           HAS_FLAG)


def _launch(seq_lens, spec_cu, spec_read, spec_write, error_flag, rows, stride, width, B, R):
    L = spec_write.shape[1]
    flag = error_flag if error_flag is not None else spec_read  # unused without HAS_FLAG
    _place_spec_rows_kernel[(rows,)](seq_lens, spec_cu, spec_read, spec_write, flag, stride,
                                     width, B, R, L=L, BLOCK_L=triton.next_power_of_2(L),
                                     HAS_FLAG=error_flag is not None)


def place_spec_rows(seq_lens: torch.Tensor, spec_cu: torch.Tensor, spec_read: torch.Tensor,
                    spec_write: torch.Tensor, rows: int, stride: int, width: int,
                    block_size: int, lookahead: int,
                    error_flag: torch.Tensor | None = None) -> None:
    """Rewrite the first ``rows`` spec rows' placeholders from the device's sequence lengths.

    seq_lens: int32 [>= rows] on the device, tokens computed before the step plus scheduled
    (vLLM's ``CommonAttentionMetadata.seq_lens``: corrected for the previous step's rejected
    drafts); spec_cu: int32 [>= rows + 1], the spec rows' token offsets (row i has
    ``spec_cu[i+1] - spec_cu[i]`` tokens: the host's, exact); spec_read: int32 [>= rows] and
    spec_write: int32 [>= rows, L] (contiguous), the planner's placeholder buffers, MUTATED: with
    n = seq_lens[i] - q_i, row i reads ``i * stride + lookahead_column(n)`` (NO_SLOT when n == 0)
    and stores the state after token t at ``i * stride + lookahead_column(n + 1 + t)`` for t < q_i,
    NO_SLOT for t >= q_i. A count that cannot be (n < 0, q outside [1, L]) or a column at or past
    ``width`` gives NO_SLOT there and ORs ERR_TOKENS / ERR_META into ``error_flag`` (int32 [>= 1],
    optional). Raises ValueError on bad arguments before launching anything.
    """
    dev = spec_read.device
    for name, t, dims in (("seq_lens", seq_lens, 1), ("spec_cu", spec_cu, 1),
                          ("spec_read", spec_read, 1), ("spec_write", spec_write, 2)):
        if t.dtype != torch.int32 or t.dim() != dims or t.device != dev:
            raise ValueError(f"{name} must be a {dims}-d int32 tensor on {dev}, got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    if not spec_write.is_contiguous() or not spec_read.is_contiguous() or not spec_cu.is_contiguous():
        raise ValueError("spec_read, spec_write and spec_cu must be contiguous")
    if not 0 <= rows <= min(seq_lens.shape[0], spec_read.shape[0], spec_write.shape[0],
                            spec_cu.shape[0] - 1):
        raise ValueError(f"rows={rows} exceeds the tensors (seq_lens {seq_lens.shape[0]}, "
                         f"spec_read {spec_read.shape[0]}, spec_cu {spec_cu.shape[0]})")
    if lookahead < spec_write.shape[1] or block_size < 1:
        raise ValueError(f"lookahead {lookahead} must be at least L = 1 + k = "
                         f"{spec_write.shape[1]} (block size {block_size})")
    if error_flag is not None and (error_flag.dtype != torch.int32 or error_flag.device != dev):
        raise ValueError("error_flag must be an int32 tensor on the same device")
    if rows:
        _launch(seq_lens, spec_cu, spec_read, spec_write, error_flag, rows, stride, width,
                block_size, lookahead)
