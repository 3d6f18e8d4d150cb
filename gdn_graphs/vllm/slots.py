"""Step planning for an engine whose block tables live on the device (vLLM).

vLLM hands an attention-metadata builder the block table as a device tensor only; reading it on the
host would sync every step. So a step is planned twice removed:

1. On the host, ``GDNPlanner`` plans the step against a *placeholder* table whose entry for row i,
   column c is the flat index ``i * table_stride + c`` (every placeholder is distinct, so the
   planner's conflict checks pass, and the chunk/checkpoint arithmetic is exactly the planner's).
2. On the device, one gather writes every slot-valued buffer of a KV-cache group (``SlotSet``):
   ``slot = table.flatten()[placeholder]``, with the engine's null block and NO_SLOT mapped to NO_SLOT.
   The placeholder plan stays as it is, so each group of the step gathers from it with its table.

Both steps are enqueued on the current stream, so a CUDA graph replayed after them reads real
block ids from the planner's persistent buffers. No step reads a tensor value on the host.

Which column a step uses is DESIGN.md's block arithmetic (n computed tokens, q scheduled, block B):
read ``(n - 1) // B`` (none when n == 0), write ``(n + q - 1) // B``, checkpoints ``p // B - 1`` for
every multiple p of B strictly inside (n, n + q). Columns before ``(n - 1) // B`` are never touched,
so stale ids that an append-only engine table still holds there are harmless.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from gdn_graphs.constants import CHUNK, NO_SLOT
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits, StepPlan

__all__ = ["StepLayout", "SlotSet", "DeviceTablePlanner", "plan_block_size"]


def plan_block_size(engine_block_size: int, prefix_caching: bool) -> int:
    """The block size the planner uses for an engine block size.

    With prefix caching the engine's block IS the checkpoint interval and must be a multiple of
    CHUNK. Without it the engine keeps one state per request (vLLM: one block of max_model_len
    tokens): any multiple of CHUNK at least that long addresses column 0 for every position."""
    if prefix_caching:
        if engine_block_size % CHUNK:
            raise ValueError(f"gdn_graphs needs a block size that is a multiple of {CHUNK} for "
                             f"prefix caching, got {engine_block_size}")
        return engine_block_size
    return -(-engine_block_size // CHUNK) * CHUNK


@dataclass(frozen=True)
class StepLayout:
    """What a layer needs on the host to launch a step (the rest is in persistent buffers)."""

    num_decodes: int          # leading decode rows to launch (the graph bucket in a padded decode)
    num_prefill_tokens: int   # prefill tokens after them
    plan: StepPlan            # host summary, slots still as placeholders


class SlotSet:
    """One KV-cache group's slot buffers: the planner's slot span rewritten with that group's block
    ids (persistent, allocated once). ``prefill`` is a ChunkMeta whose slot fields are this set's
    and whose other fields (token offsets, chunk table) are the planner's, shared by every group."""

    def __init__(self, planner: "DeviceTablePlanner"):
        gp = planner.planner
        self.flat = torch.full((gp.slot_end,), NO_SLOT, dtype=torch.int32, device=gp.device)

        spans = gp.spans

        def view(name):
            o, n = spans[name]
            return self.flat[o:o + n]

        self.decode_read, self.decode_write = view("decode_read"), view("decode_write")
        self.decode_end = gp.decode_end
        self.prefill = dataclasses.replace(gp.prefill, read_slot=view("read_slot"),
                                           write_slot=view("write_slot"),
                                           ckpt_slots=view("ckpt_slots"))

    def clear_decode_slots(self) -> None:
        """Every decode row reads and writes nothing (CUDA-graph capture on dummy tables)."""
        self.flat[:self.decode_end].fill_(NO_SLOT)


class DeviceTablePlanner:
    """A GDNPlanner whose block tables are rows of a device tensor.

    ``max_reqs`` / ``max_tokens``: the engine's per-step maxima; ``table_stride``: elements
    between rows of the engine's block table (fixed for its lifetime); ``table_width``: columns.
    The placeholder plan depends only on the token counts, so engines with several KV-cache groups
    (vLLM splits a hybrid model's layers into groups, each with its own block table) plan once per
    step and rewrite slots once per group: ``plan(..., slots=group_slots)``.
    """

    def __init__(self, max_reqs: int, max_tokens: int, block_size: int, table_stride: int,
                 table_width: int, null_block: int = 0, device: torch.device | str = "cpu"):
        if table_width > table_stride:
            raise ValueError(f"table_width {table_width} exceeds table_stride {table_stride}")
        self.table_stride, self.table_width, self.null_block = table_stride, table_width, null_block
        limits = PlanLimits(max_seqs=max_reqs, max_tokens=max_tokens, block_size=block_size,
                            num_slots=max_reqs * table_stride, max_blocks_per_seq=table_width)
        self.planner = GDNPlanner(limits, device)
        self._placeholders = np.arange(max_reqs * table_stride, dtype=np.int64).reshape(
            max_reqs, table_stride)[:, :table_width]
        self._last: tuple[bytes, StepLayout] | None = None
        self.slots = SlotSet(self)  # the default set (one-group engines, tests)

    @property
    def decode_read(self) -> torch.Tensor:
        return self.slots.decode_read

    @property
    def decode_write(self) -> torch.Tensor:
        return self.slots.decode_write

    @property
    def prefill(self):
        return self.slots.prefill

    def new_slots(self) -> SlotSet:
        return SlotSet(self)

    def clear_decode_slots(self) -> None:
        self.slots.clear_decode_slots()

    def plan(self, query_start_loc: Sequence[int] | np.ndarray, num_computed: Sequence[int] |
             np.ndarray, block_table: torch.Tensor, pad_decodes_to: int | None = None,
             slots: SlotSet | None = None) -> StepLayout:
        """Plan one step and write its slots from ``block_table`` into ``slots`` (default set).

        query_start_loc: host [rows + 1] cumulative scheduled tokens; trailing rows that schedule
        nothing are padding and are dropped. num_computed: host [>= real rows] tokens computed
        before the step. block_table: the engine's [rows', width] table (rows' >= real rows), on
        the planner's device. pad_decodes_to: launch this many decode rows when the step is pure
        decode (a CUDA-graph bucket); the padded rows get NO_SLOT. The same token counts as the
        previous call reuse its plan (another group of the same step). Raises ValueError before
        touching any buffer.
        """
        qsl = np.asarray(query_start_loc, dtype=np.int64)
        q = np.diff(qsl)
        rows = int(np.count_nonzero(q))
        if rows and not q[:rows].all():
            raise ValueError("rows that schedule no tokens must come after every real row")
        if block_table.dim() != 2 or block_table.shape[1] != self.table_width or (
                block_table.shape[0] > 1 and block_table.stride(0) != self.table_stride) or (
                block_table.stride(1) != 1):
            raise ValueError(f"block table {tuple(block_table.shape)} strides {block_table.stride()} "
                             f"does not match width {self.table_width}, row stride {self.table_stride}")
        if block_table.shape[0] < rows:
            raise ValueError(f"block table has {block_table.shape[0]} rows, the step has {rows}")
        n_rows = np.asarray(num_computed[:rows], dtype=np.int64)
        key = b"".join((qsl[:rows + 1].tobytes(), n_rows.tobytes(), repr(pad_decodes_to).encode()))
        if self._last is not None and self._last[0] == key:
            layout = self._last[1]
        else:
            qs = q[:rows].tolist()
            pure_decode = rows == 0 or max(qs) == 1
            pad = pad_decodes_to if (pad_decodes_to is not None and pure_decode) else None
            self._last = None  # a failed plan must not leave a stale key behind
            step = self.planner.plan(n_rows.tolist(), qs, self._placeholders[:rows],
                                     pad_decodes_to=pad)
            nd = step.padded_decodes if pad is not None else step.num_decodes
            layout = StepLayout(num_decodes=nd, num_prefill_tokens=step.num_prefill_tokens,
                                plan=step)
            self._last = (key, layout)
        self._translate(block_table, slots or self.slots)
        return layout

    def _translate(self, block_table: torch.Tensor, slots: SlotSet) -> None:
        """slots = block ids at the placeholders; NO_SLOT and the null block -> NO_SLOT.

        The table is read through a flat view of its storage from its first row: placeholders
        index rows by ``table_stride``, so no copy of the table is made."""
        span = self.planner.flat[:self.planner.slot_end]
        rows = block_table.shape[0]
        flat_table = block_table.as_strided(((rows - 1) * self.table_stride + self.table_width,),
                                            (1,))
        idx = span.clamp(min=0, max=flat_table.shape[0] - 1)
        ids = flat_table.index_select(0, idx).to(torch.int32)
        slots.flat.copy_(ids.masked_fill_((span < 0) | (ids == self.null_block), NO_SLOT))
