"""Host-side batch planning: token counts + block tables -> persistent device buffers -> GDNStep.

One ``GDNPlanner`` owns every device buffer that the GDN kernels (and any CUDA graph captured around
them) read to learn what a step does. They are allocated once, at their maximum sizes, as views of
ONE flat int32 device tensor, so each ``plan()`` is a single host-to-device copy and a captured
graph replays any later plan (pointers never move; the tails say "nothing here").

Rows are in the caller's order; which rows are decodes and which slots a row reads, writes and
checkpoints into is ``gdn_graphs.runtime.step``'s block arithmetic. A checkpoint entry may be
NO_SLOT (store nothing). A checkpoint whose slot equals the row's write slot is stored as NO_SLOT:
the final state lands there anyway. That is how an engine without prefix caching works: it passes
one slot repeated for every block.

Validation happens on the host BEFORE any buffer is touched, so a rejected call leaves the previous
plan intact. Only the table entries that the step uses are range-checked (a long-context table can
hold thousands of entries per row; the unused ones are never read by a kernel). The slot rules
(range, nothing written twice, nothing read that another row writes) are
``gdn_graphs.ops.meta.check_step_slots``, shared with host_chunk_meta.

Error flag: the planner also owns one int32 error flag (the last element of ``flat``, so each plan()
zeroes it in its one copy) and puts it in every step it returns; the kernels OR into it what they
met that the host could not check (gdn_graphs.ops.common: ERR_SLOT, ERR_TOKENS, ERR_META).
``read_errors()`` reads it (a sync): the codes met since the last plan().
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from gdn_graphs import nvtx
from gdn_graphs.constants import CHUNK, NO_SLOT
from gdn_graphs.ops.common import error_names
from gdn_graphs.ops.meta import (ChunkMeta, check_step_slots, host_chunk_meta, max_chunks_bound,
                                 max_ckpts_bound)
from gdn_graphs.ops.meta import num_chunks as _num_chunks
from gdn_graphs.runtime.step import (GDNStep, StepPlan, checkpoint_blocks, count_decode_rows,
                                     read_block, write_block)

__all__ = ["PlanLimits", "StepPlan", "GDNStep", "GDNPlanner"]

# Every buffer view starts on a 16-byte boundary (4 int32), so kernels see aligned pointers.
_ALIGN = 4
# Pinned staging buffers on CUDA: plan() blocks only on a copy made this many plans ago.
_STAGING_RING = 4

_META_FIELDS = ChunkMeta.tensor_fields()


def _is_int(x: Any) -> bool:
    t = type(x)
    if t is int:  # the common case, without the slow ABC check
        return True
    return t is not bool and isinstance(x, numbers.Integral)


def _as_list(xs: Any) -> list:
    return xs.tolist() if hasattr(xs, "tolist") else list(xs)


@dataclass(frozen=True)
class PlanLimits:
    """Maxima that size the planner's persistent buffers."""

    max_seqs: int            # rows in one step
    max_tokens: int          # scheduled tokens in one step
    block_size: int          # B, a positive multiple of CHUNK
    num_slots: int           # slots in the state pools
    max_blocks_per_seq: int  # width of a block-table row

    def __post_init__(self):
        for name in ("max_seqs", "max_tokens", "block_size", "num_slots", "max_blocks_per_seq"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"PlanLimits.{name} must be a positive int, got {v!r}")
        if self.block_size % CHUNK:
            raise ValueError(f"PlanLimits.block_size must be a positive multiple of {CHUNK}, "
                             f"got {self.block_size}")

    @property
    def max_chunks(self) -> int:
        return max_chunks_bound(self.max_tokens, self.max_seqs)

    @property
    def max_ckpts(self) -> int:
        return max_ckpts_bound(self.max_tokens, self.max_seqs, self.block_size)


class GDNPlanner:
    """Owns the persistent device buffers of one model's GDN layers and fills them each step.

    Buffers (int32, all views of one flat tensor ``self.flat``; never reallocated):
        decode_read[max_seqs], decode_write[max_seqs]   slots of decode row i; tail NO_SLOT
        prefill: ChunkMeta                              see gdn_graphs.ops.meta (tails padded there)
        error_flag[1]                                   the kernels' error codes; 0 after plan()
    ``plan()`` enqueues its copy on the current CUDA stream, so kernels or graph replays enqueued
    later on that stream see the new plan and earlier ones still see the old one.
    """

    def __init__(self, limits: PlanLimits, device: torch.device | str = "cpu"):
        self.limits = limits
        self.device = torch.device(device)
        S = limits.max_seqs
        # Every slot-valued buffer first, so flat[:slot_end] holds all the slots of a step and
        # nothing else (an engine whose block ids live only on the device plans on placeholder
        # slots and gathers real ones through that one span: gdn_graphs.vllm.slots).
        sizes = {"decode_read": S, "decode_write": S, "read_slot": S, "write_slot": S,
                 "ckpt_slots": limits.max_ckpts, "cu_seqlens": S + 1, "start_pos": S,
                 "ckpt_offsets": S + 1, "chunk_seq": limits.max_chunks,
                 "chunk_idx": limits.max_chunks, "error_flag": 1}
        self._spans: dict[str, tuple[int, int]] = {}
        off = 0
        for name, size in sizes.items():
            self._spans[name] = (off, size)
            off += -(-size // _ALIGN) * _ALIGN
        self._total = off
        self.decode_end = sum(self._spans["decode_write"])
        self.slot_end = sum(self._spans["ckpt_slots"])

        # NO_SLOT, not empty: the alignment gaps are never written and must not hold garbage (a
        # gap inside the slot span reads as "no slot" to anything that rewrites the span).
        self.flat = torch.full((self._total,), NO_SLOT, dtype=torch.int32, device=self.device)
        views = {name: self.flat[o:o + n] for name, (o, n) in self._spans.items()}
        self.decode_read: torch.Tensor = views["decode_read"]
        self.decode_write: torch.Tensor = views["decode_write"]
        self.prefill = ChunkMeta(block_size=limits.block_size, **{k: views[k] for k in _META_FIELDS})
        self.error_flag: torch.Tensor = views["error_flag"]

        # Host staging. On CUDA: a ring of pinned buffers used in turn, each guarded by an event,
        # so a non_blocking copy still in flight is never overwritten. Reusing a buffer waits for
        # the GPU to reach the copy made from it (the end of the steps enqueued before that plan);
        # the ring is deep enough that an engine keeping two steps in flight (vLLM's async
        # scheduling) never waits there.
        use_cuda = self.device.type == "cuda" and torch.cuda.is_available()
        n_stage = _STAGING_RING if use_cuda else 1
        self._staging = [torch.full((self._total,), NO_SLOT, dtype=torch.int32, pin_memory=use_cuda)
                         for _ in range(n_stage)]
        self._staging_np = [t.numpy() for t in self._staging]
        self._events: list[Any] = [None] * n_stage
        self._turn = 0
        self._non_blocking = use_cuda

        # The prefill part of a pure-decode step never changes: build it once.
        empty = host_chunk_meta([], [], [], [], [], limits.block_size, max_seqs=S,
                                max_chunks=limits.max_chunks, max_ckpts=limits.max_ckpts)
        self._empty_prefill = {k: np.asarray(v, dtype=np.int32) for k, v in empty.items()}

        self.last_step: GDNStep = self.plan([], [], [])

    # ------------------------------------------------------------------ public API

    @property
    def spans(self) -> dict[str, tuple[int, int]]:
        """(offset, length) of each buffer inside ``flat``."""
        return dict(self._spans)

    def buffers(self) -> list[torch.Tensor]:
        """Every persistent tensor a captured graph may read (for GraphManager's data_ptr guard)."""
        return [self.decode_read, self.decode_write, *self.prefill.tensors(), self.error_flag]

    def read_errors(self) -> int:
        """The error codes the kernels met since the last plan() (0: none), OR-ed together:
        gdn_graphs.ops.common's ERR_SLOT (a slot outside the pool, treated as NO_SLOT),
        ERR_TOKENS (token metadata beyond the tensors, clipped), ERR_META (chunk or checkpoint
        tables inconsistent, skipped); ``error_names(code)`` says them in words. SYNCHRONISES
        with the device (it reads a device value): call it after a step, outside any captured
        region, where an engine can afford a sync (e.g. when it reads the sampled tokens). A step
        planned by this planner whose slots passed plan()'s checks sets no code."""
        return int(self.error_flag.item())

    @staticmethod
    def error_names(code: int) -> list[str]:
        """The causes an error code holds, in words (empty for 0)."""
        return error_names(code)

    def plan(self, num_computed: Sequence[int], num_scheduled: Sequence[int],
             block_tables: Sequence[Sequence[int]], pad_decodes_to: int | None = None) -> GDNStep:
        """Validate one step, write it into the persistent buffers, return it as a ``GDNStep``.

        num_computed[i]: tokens of row i computed before this step (n); num_scheduled[i]: tokens
        scheduled now (q >= 1); block_tables[i]: pool slot of each block of row i (NO_SLOT allowed
        where nothing is stored); lists, tuples, numpy arrays or CPU tensors.
        pad_decodes_to: for a pure decode batch, the graph bucket it will be replayed at (rows
        beyond the real ones are NO_SLOT/NO_SLOT, as is every tail); the step then launches that
        many decode rows.
        Raises ValueError, naming the row, before touching any buffer.
        """
        with nvtx.range("gdn.plan", len(num_scheduled)):
            host, meta_lists = self._build(num_computed, num_scheduled, block_tables, pad_decodes_to)
            self._commit(host, meta_lists)
            self.last_step = GDNStep(num_decodes=host.padded_decodes,
                                     num_prefill_tokens=host.num_prefill_tokens,
                                     decode_read=self.decode_read, decode_write=self.decode_write,
                                     prefill=self.prefill, host=host, error_flag=self.error_flag)
            return self.last_step

    def template(self, num_decodes: int) -> GDNStep:
        """A step of ``num_decodes`` decode rows over the persistent buffers, whatever they hold:
        what a decode graph is captured with (each replay follows a plan padded to that size)."""
        return GDNStep(num_decodes=num_decodes, num_prefill_tokens=0, decode_read=self.decode_read,
                       decode_write=self.decode_write, prefill=self.prefill,
                       error_flag=self.error_flag)

    # ------------------------------------------------------------------ host side, no buffer touched

    def _build(self, num_computed, num_scheduled, block_tables, pad_decodes_to):
        L = self.limits
        ns, qs, tables = self._check_rows(num_computed, num_scheduled, block_tables)
        rows = len(ns)
        d = count_decode_rows(qs)
        reads, writes, ckpts = [], [], []
        for i in range(rows):
            r, w, ck = self._row_slots(i, ns[i], qs[i], tables[i])
            reads.append(r)
            writes.append(w)
            ckpts.append(ck)
        B = L.block_size

        def entry(i: int, kind: str, e: int) -> str:  # the table entry a slot came from
            n = ns[i]
            blocks = {"read": read_block(n, B), "write": write_block(n, qs[i], B)}
            return f"block table entry {blocks.get(kind, n // B + e)}"

        check_step_slots(reads, writes, ckpts, L.num_slots, where=entry)
        padded = self._padded_decodes(pad_decodes_to, d, rows, qs)

        meta_lists = None
        num_chunks = num_ckpts = 0
        if d < rows:  # (the slots of every row were checked above)
            meta_lists = host_chunk_meta(qs[d:], ns[d:], reads[d:], writes[d:], ckpts[d:],
                                         L.block_size, max_seqs=L.max_seqs,
                                         max_chunks=L.max_chunks, max_ckpts=L.max_ckpts,
                                         check_slots=False)
            num_ckpts = sum(len(c) for c in ckpts[d:])
            num_chunks = sum(_num_chunks(n, q) for n, q in zip(ns[d:], qs[d:]))
        total = sum(qs)
        host = StepPlan(
            num_decodes=d, num_prefills=rows - d, num_prefill_tokens=total - d, num_tokens=total,
            padded_decodes=padded, num_chunks=num_chunks, num_ckpts=num_ckpts,
            decode_read=tuple(reads[:d]), decode_write=tuple(writes[:d]),
            prefill_read=tuple(reads[d:]), prefill_write=tuple(writes[d:]),
            prefill_ckpts=tuple(tuple(c) for c in ckpts[d:]))
        return host, meta_lists

    def _check_rows(self, num_computed, num_scheduled, block_tables):
        """Types, lengths and the step's totals; returns (ns, qs, tables) as ints / row lists."""
        L = self.limits
        ns, qs, tables = _as_list(num_computed), _as_list(num_scheduled), block_tables
        if isinstance(tables, torch.Tensor):
            tables = tables.cpu().numpy()  # numpy row slices are much cheaper than tensor ones
        if not (len(ns) == len(qs) == len(tables)):
            raise ValueError(f"num_computed, num_scheduled and block_tables differ in length: "
                             f"{len(ns)}, {len(qs)}, {len(tables)}")
        if len(ns) > L.max_seqs:
            raise ValueError(f"batch of {len(ns)} rows is larger than max_seqs={L.max_seqs}")
        for i, (n, q) in enumerate(zip(ns, qs)):
            if not _is_int(n) or not _is_int(q):
                raise ValueError(f"row {i}: num_computed and num_scheduled must be ints, got {n!r}, {q!r}")
            if q < 1 or n < 0:
                raise ValueError(f"row {i}: needs num_scheduled >= 1 and num_computed >= 0, got q={q}, n={n}")
        ns, qs = [int(n) for n in ns], [int(q) for q in qs]  # numpy scalars -> int
        total = sum(qs)
        if total > L.max_tokens:
            raise ValueError(f"batch schedules {total} tokens, more than max_tokens={L.max_tokens}")
        return ns, qs, tables

    def _row_slots(self, i: int, n: int, q: int, row) -> tuple[int, int, list[int]]:
        """Row i's read slot, write slot and checkpoint slots (step.py's block arithmetic), from
        the table entries it uses, which must be ints (check_step_slots checks their range)."""
        L = self.limits
        B = L.block_size
        width = len(row)
        if width > L.max_blocks_per_seq:
            raise ValueError(f"row {i}: block table has {width} entries, more than "
                             f"max_blocks_per_seq={L.max_blocks_per_seq}")
        last = write_block(n, q, B)
        if last >= width:
            raise ValueError(f"row {i}: block table has {width} entries but n={n}, q={q} "
                             f"needs block {last} (B={B})")
        # the step touches blocks lo..last only: read_block(n) is n // B or the block before it
        lo = max(read_block(n, B), 0)
        used = _as_list(row[lo:last + 1])
        for j, s in enumerate(used):
            if type(s) is not int:
                if not _is_int(s):
                    raise ValueError(f"row {i}: block table entry {lo + j} is not an int: {s!r}")
                used[j] = int(s)
        w = used[-1]
        if w == NO_SLOT:
            raise ValueError(f"row {i}: write slot table[{last}] is {NO_SLOT}")
        r = NO_SLOT
        if n > 0:
            r = used[0]
            if r == NO_SLOT:
                raise ValueError(f"row {i}: read slot table[{lo}] is {NO_SLOT} but n={n} > 0 "
                                 f"tokens were computed")
        ckpts = [NO_SLOT if used[c - lo] == w else used[c - lo] for c in checkpoint_blocks(n, q, B)]
        return r, w, ckpts

    def _padded_decodes(self, pad_decodes_to, num_decodes: int, rows: int, qs) -> int:
        if pad_decodes_to is None:
            return num_decodes
        if not _is_int(pad_decodes_to):
            raise ValueError(f"pad_decodes_to must be an int, got {pad_decodes_to!r}")
        if num_decodes < rows:
            raise ValueError(f"pad_decodes_to is only for pure decode batches, but row "
                             f"{num_decodes} schedules {qs[num_decodes]} tokens (a prefill row)")
        if pad_decodes_to < num_decodes:
            raise ValueError(f"pad_decodes_to={pad_decodes_to} is smaller than the "
                             f"{num_decodes} decode rows")
        if pad_decodes_to > self.limits.max_seqs:
            raise ValueError(f"pad_decodes_to={pad_decodes_to} is larger than "
                             f"max_seqs={self.limits.max_seqs}")
        return pad_decodes_to

    # ------------------------------------------------------------------ device side

    def _commit(self, step: StepPlan, meta_lists: dict[str, list[int]] | None) -> None:
        k = self._turn
        self._turn = (k + 1) % len(self._staging)
        if self._events[k] is not None:
            self._events[k].synchronize()  # the copy that last read this staging buffer is done
        st = self._staging_np[k]
        o, size = self._spans["decode_read"]
        d = step.num_decodes
        st[o:o + d] = step.decode_read
        st[o + d:o + size] = NO_SLOT
        o, size = self._spans["decode_write"]
        st[o:o + d] = step.decode_write
        st[o + d:o + size] = NO_SLOT
        src = self._empty_prefill if meta_lists is None else meta_lists
        for name in _META_FIELDS:
            o, size = self._spans[name]
            st[o:o + size] = src[name]
        st[self._spans["error_flag"][0]] = 0  # each plan starts with no error
        with nvtx.range("gdn.plan.copy"):
            self.flat.copy_(self._staging[k], non_blocking=self._non_blocking)
            if self._non_blocking:
                if self._events[k] is None:
                    self._events[k] = torch.cuda.Event()
                self._events[k].record()
