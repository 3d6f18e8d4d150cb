"""One step of a batch, as every GDN layer sees it: the block arithmetic, the row kinds, ``GDNStep``.

Block arithmetic (stated here once; README "Conventions" is the canonical statement). Block b of
a request covers tokens [b*B, (b+1)*B), B a multiple of CHUNK. A row that starts with ``n``
computed tokens and schedules ``q`` tokens, with block table ``table`` (one pool slot per block):

    read slot   table[(n - 1) // B]      NO_SLOT when n == 0 (start from zeros)
    write slot  table[(n + q - 1) // B]  the state after its last token
    checkpoint  table[p // B - 1]        for every multiple p of B strictly inside (n, n + q)

Checkpoint e of a row (e = 0, 1, ...) is the state after p_e = (n // B + 1 + e) * B tokens, so
it lands in ``table[n // B + e]``. A step touches only the blocks ``read_block .. write_block``;
the rest of the table is never read.

Row kinds (``count_decode_rows``): the leading rows that schedule exactly one token are decode
rows (decode kernel, their tokens first in the flat batch); every later row is a prefill row
(chunk kernels), whatever its length. The flat token batch of a step is therefore
``[decode rows | prefill tokens | padding]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from gdn_graphs.ops.meta import ChunkMeta

__all__ = ["read_block", "write_block", "checkpoint_blocks", "count_decode_rows", "StepPlan",
           "GDNStep"]


def read_block(n: int, B: int) -> int:
    """Block holding the state after ``n`` tokens; -1 when n == 0 (nothing to read)."""
    return (n - 1) // B if n > 0 else -1


def write_block(n: int, q: int, B: int) -> int:
    """Block receiving the state after ``n + q`` tokens."""
    return (n + q - 1) // B


def checkpoint_blocks(n: int, q: int, B: int) -> range:
    """Blocks receiving the states at the multiples of B strictly inside (n, n + q)."""
    return range(n // B, write_block(n, q, B))


def count_decode_rows(num_scheduled: Sequence[int]) -> int:
    """Leading rows that schedule exactly one token: the decode rows of a step."""
    nd = 0
    for q in num_scheduled:
        if q != 1:
            break
        nd += 1
    return nd


@dataclass(frozen=True)
class StepPlan:
    """Host-side summary of a validated step (slots as the kernels see them)."""

    num_decodes: int
    num_prefills: int
    num_prefill_tokens: int
    num_tokens: int                      # real scheduled tokens (decodes first, then prefills)
    padded_decodes: int                  # decode rows to launch (== num_decodes unless padded)
    num_chunks: int                      # live entries of the prefill chunk table
    num_ckpts: int                       # live entries of the prefill checkpoint slots
    decode_read: tuple[int, ...]
    decode_write: tuple[int, ...]
    prefill_read: tuple[int, ...]
    prefill_write: tuple[int, ...]
    prefill_ckpts: tuple[tuple[int, ...], ...]  # per prefill row, NO_SLOT where nothing is stored

    @property
    def num_seqs(self) -> int:
        return self.num_decodes + self.num_prefills

    @property
    def is_pure_decode(self) -> bool:
        return self.num_prefills == 0


@dataclass(frozen=True)
class GDNStep:
    """What the GDN core of every layer needs for one step; produced by a planner, read by
    ``gdn_graphs.runtime.core.run_gdn_core``.

    The tensors are persistent int32 views (allocated once by the planner or a vLLM slot set), so a
    CUDA graph captured with one step replays correctly after any later plan into the same buffers.
    ``num_decodes`` and ``num_prefill_tokens`` are host ints: they shape the launches, so a graph
    is captured per value (the decode bucket) and the piecewise path reads them per step. The
    kernels never touch memory outside their tensors whatever the buffers hold; what they had to
    repair (a slot outside the pool, spans past the tokens) lands in ``error_flag``.
    """

    num_decodes: int              # decode rows to launch (the bucket size in a padded decode)
    num_prefill_tokens: int       # prefill tokens after them
    decode_read: torch.Tensor     # [>= num_decodes] read slot of decode row i (NO_SLOT: zeros)
    decode_write: torch.Tensor    # [>= num_decodes] write slot of decode row i (NO_SLOT: none)
    prefill: ChunkMeta            # the prefill rows; launched only when num_prefill_tokens > 0
    host: Optional[StepPlan] = None  # what plan() validated (None for a capture-time template)
    # int32 [>= 1] persistent device flag every kernel of the step ORs its error codes into
    # (gdn_graphs.ops.common: ERR_SLOT, ERR_TOKENS, ERR_META); None: nothing is reported. The
    # planner owns it, zeroes it in each plan() and reads it back (GDNPlanner.read_errors).
    error_flag: Optional[torch.Tensor] = None

    @property
    def num_tokens(self) -> int:
        """Tokens the step launches: decode rows (padded) + prefill tokens."""
        return self.num_decodes + self.num_prefill_tokens
