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

Which columns a step uses is the block arithmetic of ``gdn_graphs.runtime.step``. Columns before
the read block are never touched, so stale ids that an append-only engine table still holds there
are harmless.

The real block ids never pass the host checks (they stay on the device), so the kernels' own
guard is the last line there: a block id outside the KV cache is read and written as NO_SLOT and
sets the step's error flag (README "Conventions"). ``ErrorWatch`` brings that flag back without a
sync and says what it holds.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Sequence

import numpy as np
import torch

from gdn_graphs.constants import CHUNK, NO_SLOT
from gdn_graphs.ops.common import error_names
from gdn_graphs.ops.meta import ChunkMeta
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import GDNStep, count_decode_rows
from gdn_graphs.vllm.spec_placement import place_spec_rows

__all__ = ["SlotSet", "DeviceTablePlanner", "ErrorWatch", "plan_block_size"]

_log = logging.getLogger("vllm.gdn_graphs")


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
        self.spec_read, o = view("spec_read"), spans["spec_write"][0]
        self.spec_write = self.flat[o:o + spans["spec_write"][1]].view(gp.spec_write.shape)
        # decode and spec slots end here (the spans are laid out in that order, plan.py)
        self.rows_end = max(self.decode_end, sum(spans["spec_write"]))
        self._last: tuple[GDNStep, GDNStep] | None = None
        self.prefill = dataclasses.replace(
            gp.prefill, **{name: view(name) for name in ChunkMeta.SLOT_FIELDS})

    def step(self, placeholder_step: GDNStep) -> GDNStep:
        """The planner's step with this set's slot views (made once per plan: vLLM builds every
        group's metadata every step, and decode steps often repeat the previous plan)."""
        if self._last is None or self._last[0] is not placeholder_step:
            self._last = (placeholder_step, dataclasses.replace(
                placeholder_step, decode_read=self.decode_read, decode_write=self.decode_write,
                prefill=self.prefill, spec_read=self.spec_read, spec_write=self.spec_write))
        return self._last[1]

    def clear_decode_slots(self) -> None:
        """Every decode and spec row reads and writes nothing (CUDA-graph capture on dummy
        tables)."""
        self.flat[:self.rows_end].fill_(NO_SLOT)


class ErrorWatch:
    """The kernels' error flag of an engine that never syncs for it (vLLM), read one step late.

    ``poll()`` runs on the host before each new plan (once a step): it reports what its previous copy of the flag
    brought back, once that copy has landed (an event query, never a wait), then enqueues the next
    copy to pinned memory. Enqueued before plan() zeroes the flag, a copy holds the codes of the
    steps enqueued since the last zeroing. A code is reported when it first appears. ``report(code, names)`` defaults to
    an error line under vLLM's logger."""

    def __init__(self, flag: torch.Tensor,
                 report: Callable[[int, list[str]], None] | None = None):
        self.flag = flag
        cuda = flag.device.type == "cuda"
        self._host = torch.zeros(1, dtype=torch.int32, pin_memory=cuda)
        self._event = torch.cuda.Event() if cuda else None
        self._pending = False
        self._last = 0
        self.report = report or self._log
        self.reported: list[int] = []   # every code reported, in order

    @staticmethod
    def _log(code: int, names: list[str]) -> None:
        _log.error("gdn_graphs: the GDN kernels met %s (error code %d) in a recent step: an id "
                   "outside the KV cache or the step's tensors reached them. Nothing outside was "
                   "read or written (such a row read zeros or stored nothing), but the requests "
                   "of that step may be wrong: please report this as a bug.",
                   ", ".join(names), code)

    def poll(self) -> None:
        if self._event is not None and torch.cuda.is_current_stream_capturing():
            return  # a plan made while a graph is captured: no copy, no event there
        if self._pending and (self._event is None or self._event.query()):
            self._pending = False
            code = int(self._host[0])
            if code and code != self._last:
                self.reported.append(code)
                self.report(code, error_names(code))
            self._last = code
        if not self._pending:
            self._host.copy_(self.flag, non_blocking=self._event is not None)
            if self._event is not None:
                self._event.record()
            self._pending = True


class DeviceTablePlanner:
    """A GDNPlanner whose block tables are rows of a device tensor.

    ``max_reqs`` / ``max_tokens``: the engine's per-step maxima; ``table_width``: the block-table
    columns a request can ever use (``cdiv(max_model_len, block_size)``). Placeholders index a
    virtual table of ``table_stride`` (default ``table_width``) elements per row; an engine table
    with that row stride is gathered from in place, any other one (more columns, another stride)
    through a copy of its first ``table_width`` columns. The placeholder plan depends only on the
    token counts, so engines with several KV-cache groups (vLLM splits a hybrid model's layers into
    groups, each with its own block table) plan once per step and gather once per group:
    ``plan(..., slots=group_slots)``.
    """

    def __init__(self, max_reqs: int, max_tokens: int, block_size: int, table_stride: int | None,
                 table_width: int, null_block: int = 0, device: torch.device | str = "cpu",
                 max_spec_len: int = 0, lookahead: int = 0):
        table_stride = table_width if table_stride is None else table_stride
        if table_width > table_stride:
            raise ValueError(f"table_width {table_width} exceeds table_stride {table_stride}")
        self.table_stride, self.table_width, self.null_block = table_stride, table_width, null_block
        limits = PlanLimits(max_seqs=max_reqs, max_tokens=max_tokens, block_size=block_size,
                            num_slots=max_reqs * table_stride, max_blocks_per_seq=table_width,
                            max_spec_len=max_spec_len, lookahead=lookahead)
        self.planner = GDNPlanner(limits, device)
        self._placeholders = np.arange(max_reqs * table_stride, dtype=np.int64).reshape(
            max_reqs, table_stride)[:, :table_width]
        self._last: tuple[bytes, GDNStep] | None = None  # (_plan_key, the placeholder step)
        self._last_step_inputs: bytes | None = None       # plan()'s inputs at its last call
        self._last_rows = 0
        self._last_inputs: tuple | None = None  # remember_inputs / same_inputs
        self.slots = SlotSet(self)  # the default set (one-group engines, tests)
        self.errors = ErrorWatch(self.planner.error_flag)
        # The gather's index and "no placeholder" mask depend on the placeholder plan alone (and
        # the index's clamp on the flat table's length), not on a group's table: made once per
        # plan into these persistent buffers and shared by every group's gather (_gather).
        span_len = self.planner.slot_end
        self._gather_idx = torch.zeros(span_len, dtype=torch.int32, device=self.planner.device)
        self._no_placeholder = torch.zeros(span_len, dtype=torch.bool, device=self.planner.device)
        self._drop = torch.zeros(span_len, dtype=torch.bool, device=self.planner.device)
        self._gather_idx_len: int | None = None  # the flat table length _gather_idx is clamped to
        self._new_gather_plan()

    def new_slots(self) -> SlotSet:
        return SlotSet(self)

    def plan(self, query_start_loc: Sequence[int] | np.ndarray, num_computed: Sequence[int] |
             np.ndarray, block_table: torch.Tensor, pad_decodes_to: int | None = None,
             slots: SlotSet | None = None, spec_rows: int = 0,
             device_seq_lens: torch.Tensor | None = None) -> GDNStep:
        """Plan one step and write its slots from ``block_table`` into ``slots`` (default set);
        returns the step over that set's buffers.

        query_start_loc: host [rows + 1] cumulative scheduled tokens; trailing rows that schedule
        nothing are padding and are dropped. num_computed: host [>= real rows] tokens computed
        before the step. block_table: the engine's [rows', width'] table (rows' >= real rows,
        width' >= table_width, columns contiguous), on the planner's device. pad_decodes_to:
        launch this many decode rows when the step is pure decode (a CUDA-graph bucket); the padded
        rows get NO_SLOT. spec_rows: the leading rows that are spec rows (a planner with a
        lookahead layout: any length up to max_spec_len); a step of spec rows alone, all of one
        length, is padded to ``pad_decodes_to`` spec rows. device_seq_lens: int32 [>= rows] on the
        planner's device, the true tokens computed before the step plus scheduled (vLLM's
        ``seq_lens`` under async scheduling, where the host's counts of a row whose previous step
        had drafts are optimistic): the spec rows' slots are then placed from it on the device
        (``spec_placement``; the other rows' counts must be exact on the host). The same token
        counts as the previous call reuse its plan (another group of the same step), and so does
        a step of decode rows only that reads and writes the same block columns as the previous
        plan (``_plan_key``): most decode steps cross no block boundary, so they only gather.
        Raises ValueError before touching any buffer.
        """
        self._last_inputs = None  # until this call has succeeded
        qsl = np.asarray(query_start_loc, dtype=np.int64)
        q = np.diff(qsl)
        rows = int(np.count_nonzero(q))
        if rows and not q[:rows].all():
            raise ValueError("rows that schedule no tokens must come after every real row")
        self._check_table(block_table, rows)
        self._check_device_counts(device_seq_lens, spec_rows, rows)
        n_rows = np.asarray(num_computed[:rows], dtype=np.int64)
        inputs = b"".join((qsl[:rows + 1].tobytes(), n_rows.tobytes(),
                           repr((pad_decodes_to, spec_rows)).encode()))
        if inputs != self._last_step_inputs:  # a new step (not another group of the last one)
            self.errors.poll()  # before a plan zeroes the flag
            self._last_step_inputs = inputs
        key = self._plan_key(inputs, n_rows, q[:rows], pad_decodes_to, spec_rows, device_seq_lens)
        if self._last is not None and self._last[0] == key:
            placeholder_step = self._last[1]  # another group, or the same decode columns
        else:
            self._last = None  # a failed plan must not leave a stale key behind
            placeholder_step = self._plan_rows(n_rows, q[:rows], pad_decodes_to, spec_rows)
            self._new_gather_plan()
            self._last = (key, placeholder_step)
        self._place_on_device(placeholder_step, device_seq_lens)
        self._last_rows = rows
        slots = slots or self.slots
        self._gather(block_table, slots)
        return slots.step(placeholder_step)

    def _plan_key(self, inputs: bytes, n: np.ndarray, q: np.ndarray, pad_to, spec_rows: int,
                  device_seq_lens) -> bytes:
        """What the placeholder plan is a function of: the step's inputs, or for a step of
        decode rows only (one token each, no spec rows) the block columns each row reads and
        writes, (n - 1) // B and n // B (read_block / write_block: -1 reads nothing), and the
        padding. Its rows' placeholders are ``row * table_stride + column``, so equal columns give
        an equal plan, buffers included (the error flag aside: a reused plan does not zero it, so
        a code stays until the next plan, and ErrorWatch reports it once)."""
        if not len(q) or spec_rows or device_seq_lens is not None or not (q == 1).all():
            return inputs
        B = self.planner.limits.block_size
        return b"".join((b"decode", ((n - 1) // B).tobytes(), (n // B).tobytes(),
                         repr(pad_to).encode()))

    def remember_inputs(self, inputs: tuple) -> None:
        """Name the inputs of the call that just succeeded: ``inputs`` is the caller's exact
        record of everything its plan() arguments were computed from (vLLM's builder: the query
        start locations, sequence lengths, draft counts and row count), so that another group of
        the same step can skip straight to its gather (``same_inputs``)."""
        self._last_inputs = inputs

    def same_inputs(self, inputs: tuple, block_table: torch.Tensor, slots: SlotSet,
                    device_seq_lens: torch.Tensor | None = None) -> GDNStep | None:
        """The last call's step over ``slots``, gathered from ``block_table``, when ``inputs`` equal
        the ones ``remember_inputs`` named for it (None otherwise): what plan() would do with the
        same arguments (its plan is a function of them; the table and device counts are checked
        and the spec rows placed from those counts as plan() does) without recomputing them."""
        if self._last_inputs is None or self._last is None or self._last_inputs != inputs:
            return None
        step = self._last[1]
        self._check_table(block_table, self._last_rows)
        self._check_device_counts(device_seq_lens, step.host.num_spec, self._last_rows)
        self._place_on_device(step, device_seq_lens)
        self._gather(block_table, slots)
        return slots.step(step)

    def _check_device_counts(self, device_seq_lens, spec_rows: int, rows: int) -> None:
        if device_seq_lens is not None and spec_rows and (
                device_seq_lens.dtype != torch.int32 or device_seq_lens.dim() != 1
                or device_seq_lens.shape[0] < rows
                or device_seq_lens.device.type != self.planner.device.type):
            raise ValueError(f"device_seq_lens must be an int32 [>= {rows}] tensor on "
                             f"{self.planner.device}, got {device_seq_lens.dtype} "
                             f"{tuple(device_seq_lens.shape)} on {device_seq_lens.device}")

    def _check_table(self, block_table: torch.Tensor, rows: int) -> None:
        if block_table.dim() != 2 or block_table.shape[1] < self.table_width or (
                block_table.shape[1] > 1 and block_table.stride(1) != 1):
            raise ValueError(f"block table {tuple(block_table.shape)} strides {block_table.stride()} "
                             f"needs at least {self.table_width} contiguous columns")
        if block_table.shape[0] < rows:
            raise ValueError(f"block table has {block_table.shape[0]} rows, the step has {rows}")

    def _plan_rows(self, ns: np.ndarray, qs: np.ndarray, pad_to: int | None,
                   spec_rows: int) -> GDNStep:
        """The placeholder plan: decode rows padded to ``pad_to`` in a pure decode step, spec
        rows (the first ``spec_rows``) padded to it in a step of spec rows of one length
        (``ns``, ``qs``: int64 arrays, which the planner checks at once)."""
        rows = len(qs)
        if not spec_rows:
            pad = pad_to if count_decode_rows(qs) == rows else None
            return self.planner.plan(ns, qs, self._placeholders[:rows], pad_decodes_to=pad)
        if spec_rows > rows:
            raise ValueError(f"spec_rows={spec_rows} but the step has {rows} rows")
        uniform = spec_rows == rows and len(set(qs)) == 1
        pad = pad_to if uniform and pad_to is not None and pad_to >= rows else None
        return self.planner.plan(ns, qs, self._placeholders[:rows],
                                 spec=[i < spec_rows for i in range(rows)], pad_spec_to=pad)

    def _place_on_device(self, step: GDNStep, device_seq_lens: torch.Tensor | None) -> None:
        """The real spec rows' placeholders from the device's counts (padded rows keep NO_SLOT);
        nothing without device counts or spec rows. Every call, another group's reuse included:
        the same host counts in a later step may come with other device counts, and rerunning it
        on the same ones changes nothing. The placement changes the placeholder span, so the
        gather's mask and index are made again from it (_new_gather_plan)."""
        if device_seq_lens is None or not step.host.num_spec:
            return
        gp = self.planner
        place_spec_rows(device_seq_lens, gp.spec_cu, gp.spec_read, gp.spec_write,
                        rows=step.host.num_spec, stride=self.table_stride, width=self.table_width,
                        block_size=gp.limits.block_size, lookahead=gp.limits.lookahead,
                        error_flag=gp.error_flag)
        self._new_gather_plan()

    def _flat_table(self, block_table: torch.Tensor) -> torch.Tensor:
        """The table as a flat tensor that the placeholders index (row i at i * table_stride): a
        view of its storage when its row stride is ours, else a copy of its used columns."""
        rows = block_table.shape[0]
        if rows == 1 or block_table.stride(0) == self.table_stride:
            return block_table.as_strided(((rows - 1) * self.table_stride + self.table_width,),
                                          (1,))
        padded = block_table.new_full((rows, self.table_stride), self.null_block)
        padded[:, :self.table_width] = block_table[:, :self.table_width]
        return padded.view(-1)

    def _new_gather_plan(self) -> None:
        """A new placeholder plan is in the span: mark its entries without a placeholder (NO_SLOT
        and the alignment gaps) once for every group; the index is clamped at the next gather."""
        torch.lt(self.planner.flat[:self.planner.slot_end], 0, out=self._no_placeholder)
        self._gather_idx_len = None

    def _gather_index(self, flat_len: int) -> torch.Tensor:
        """The placeholder span as indices into a flat table of ``flat_len`` entries (NO_SLOT ->
        0; the clamp above is a second guard: plan() has checked the table's rows), made once per
        plan and table length (vLLM's groups of a step share both)."""
        if self._gather_idx_len != flat_len:
            torch.clamp(self.planner.flat[:self.planner.slot_end], min=0, max=flat_len - 1,
                        out=self._gather_idx)
            self._gather_idx_len = flat_len
        return self._gather_idx

    def _gather(self, block_table: torch.Tensor, slots: SlotSet) -> None:
        """slots = block ids at the placeholders; NO_SLOT and the null block -> NO_SLOT.

        Four launches per group, in place in the group's persistent buffer (no allocation): the
        gather, the null-block test, the placeholder mask and the fill."""
        flat_table = self._flat_table(block_table)
        idx = self._gather_index(flat_table.shape[0])
        if flat_table.dtype == torch.int32:  # vLLM's tables: gather straight into the slot buffer
            torch.index_select(flat_table, 0, idx, out=slots.flat)
        else:
            slots.flat.copy_(flat_table.index_select(0, idx))
        torch.eq(slots.flat, self.null_block, out=self._drop)
        self._drop.logical_or_(self._no_placeholder)
        slots.flat.masked_fill_(self._drop, NO_SLOT)
