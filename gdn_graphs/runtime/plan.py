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
from gdn_graphs.runtime.step import (GDNStep, StepPlan, checkpoint_blocks, classify_rows,
                                     decode_rows, lookahead_column, lookahead_row_slots,
                                     lookahead_spec_rows, read_block,
                                     row_read_slot, spec_write_slots, write_block)

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


def _decode_slots_ok(reads: list[int], writes: list[int], num_slots: int) -> bool:
    """``check_step_slots``' rules for decode rows (no checkpoints), in numpy: every slot in
    [NO_SLOT, num_slots), no slot written twice, no row reading a slot another row writes."""
    r, w = np.asarray(reads, dtype=np.int64), np.asarray(writes, dtype=np.int64)
    if len(r) and (min(r.min(), w.min()) < NO_SLOT or max(r.max(), w.max()) >= num_slots):
        return False
    written = np.sort(w[w != NO_SLOT])  # (sort and searchsorted: cheaper than unique / isin)
    if (written[1:] == written[:-1]).any():
        return False
    # a read of a written slot is fine only where the row writes it itself (decode in place)
    at = np.minimum(np.searchsorted(written, r), max(len(written) - 1, 0))
    hit = written[at] == r if len(written) else np.zeros(len(r), dtype=bool)
    return not (hit & (r != w) & (r != NO_SLOT)).any()


@dataclass(frozen=True)
class PlanLimits:
    """Maxima that size the planner's persistent buffers."""

    max_seqs: int            # rows in one step
    max_tokens: int          # scheduled tokens in one step
    block_size: int          # B, a positive multiple of CHUNK
    num_slots: int           # slots in the state pools
    max_blocks_per_seq: int  # width of a block-table row
    max_spec_len: int = 0    # tokens of a spec row (1 + k) at most; 0: no spec rows (no buffers)
    # R of the lookahead layout (step.py), spec rows of any length up to max_spec_len; 0: rings
    lookahead: int = 0

    def __post_init__(self):
        for name in ("max_seqs", "max_tokens", "block_size", "num_slots", "max_blocks_per_seq"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"PlanLimits.{name} must be a positive int, got {v!r}")
        if self.block_size % CHUNK:
            raise ValueError(f"PlanLimits.block_size must be a positive multiple of {CHUNK}, "
                             f"got {self.block_size}")
        v = self.max_spec_len
        if not _is_int(v) or not 0 <= v <= self.block_size:
            raise ValueError(f"PlanLimits.max_spec_len must be an int in [0, block_size], got {v!r}")
        R = self.lookahead
        if not _is_int(R) or (R and (not v or R < v)):
            raise ValueError(f"PlanLimits.lookahead must be 0 or, with max_spec_len = 1 + k > 0, "
                             f"at least k + 1 = {v}, got {R!r}")

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
        spec_read[max_seqs], spec_write[max_seqs, L]    slots of spec row i (L = max_spec_len;
                                                        entry [i, t]: the state after token t);
                                                        tail NO_SLOT. Empty when L == 0.
        prefill: ChunkMeta                              see gdn_graphs.ops.meta (tails padded there)
        spec_cu[max_seqs + 1]                           i * spec_len up to the launched spec rows,
                                                        then repeating (0-token rows)
        spec_accepted[max_seqs]                         the ``accepted`` count of each spec row
                                                        (what chose its read slot; no kernel reads
                                                        it, a graph or a sampler may); tail 0
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
        L = limits.max_spec_len
        sizes = {"decode_read": S, "decode_write": S, "spec_read": S if L else 0,
                 "spec_write": S * L, "read_slot": S, "write_slot": S,
                 "ckpt_slots": limits.max_ckpts, "cu_seqlens": S + 1, "start_pos": S,
                 "ckpt_offsets": S + 1, "chunk_seq": limits.max_chunks,
                 "chunk_idx": limits.max_chunks, "spec_cu": S + 1 if L else 0,
                 "spec_accepted": S if L else 0, "error_flag": 1}
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
        self.spec_read: torch.Tensor = views["spec_read"]
        self.spec_write: torch.Tensor = views["spec_write"].view(S if L else 0, L)
        self.spec_cu: torch.Tensor = views["spec_cu"]
        self.spec_accepted: torch.Tensor = views["spec_accepted"]
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
        spec = [self.spec_read, self.spec_write, self.spec_cu, self.spec_accepted]
        return [self.decode_read, self.decode_write, *self.prefill.tensors(), self.error_flag,
                *(spec if self.limits.max_spec_len else [])]

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
             block_tables: Sequence[Sequence[int]], pad_decodes_to: int | None = None, *,
             spec: Sequence[bool] | None = None, rings: Sequence[Sequence[int] | None] | None = None,
             accepted: Sequence[int] | None = None, pad_spec_to: int | None = None) -> GDNStep:
        """Validate one step, write it into the persistent buffers, return it as a ``GDNStep``.

        num_computed[i]: tokens of row i computed before this step (n); num_scheduled[i]: tokens
        scheduled now (q >= 1); block_tables[i]: pool slot of each block of row i (NO_SLOT allowed
        where nothing is stored); lists, tuples, numpy arrays or CPU tensors.
        pad_decodes_to: for a pure decode batch, the graph bucket it will be replayed at (rows
        beyond the real ones are NO_SLOT/NO_SLOT, as is every tail); the step then launches that
        many decode rows.
        Speculative decoding (step.py's module docstring states the slot rules):
        spec[i]: row i is a spec row (it verifies q = 1 + k tokens, one k for every spec row;
        rows are ordered [decode | spec | prefill]); rings[i]: the request's private ring of
        R >= q + 1 slots (needed by a spec row and by any row with accepted > 0, else None);
        accepted[i]: 0, or the tokens that the request's previous step (a spec row) accepted,
        which puts its state after n in the ring unless n is a multiple of B.
        pad_spec_to: for a batch of spec rows only, the graph bucket (padded rows read and store
        nothing; their tokens, spec_len each, are computed from zeros and are to be ignored).
        Raises ValueError, naming the row, before touching any buffer.
        """
        with nvtx.range("gdn.plan", len(num_scheduled)):
            host, meta_lists = self._build(num_computed, num_scheduled, block_tables,
                                           pad_decodes_to, spec, rings, accepted, pad_spec_to)
            self._commit(host, meta_lists)
            self.last_step = self._step(host.padded_decodes, host.padded_spec, host.spec_len,
                                        host.num_prefill_tokens, host,
                                        host.num_tokens - host.num_decodes - host.num_prefill_tokens
                                        + (host.padded_spec - host.num_spec) * host.spec_len)
            return self.last_step

    def _step(self, nd: int, ns: int, L: int, n_pre: int, host: StepPlan | None,
              spec_tokens: int | None = None) -> GDNStep:
        if spec_tokens is not None and spec_tokens == ns * L:
            spec_tokens = None  # uniform rows: num_spec * spec_len says it
        return GDNStep(num_decodes=nd, num_prefill_tokens=n_pre, decode_read=self.decode_read,
                       decode_write=self.decode_write, prefill=self.prefill, host=host,
                       error_flag=self.error_flag, num_spec=ns, spec_len=L if ns else 0,
                       spec_read=self.spec_read, spec_write=self.spec_write, spec_cu=self.spec_cu,
                       spec_tokens=spec_tokens if ns else None)

    def template(self, num_decodes: int) -> GDNStep:
        """A step of ``num_decodes`` decode rows over the persistent buffers, whatever they hold:
        what a decode graph is captured with (each replay follows a plan padded to that size)."""
        return self._step(num_decodes, 0, 0, 0, None)

    def spec_template(self, num_spec: int, spec_len: int) -> GDNStep:
        """A step of ``num_spec`` spec rows of ``spec_len`` tokens over the persistent buffers:
        what a spec graph is captured with (each replay follows a plan with pad_spec_to=num_spec
        and that spec_len)."""
        if not 1 <= spec_len <= self.limits.max_spec_len:
            raise ValueError(f"spec_len must be in [1, max_spec_len={self.limits.max_spec_len}], "
                             f"got {spec_len}")
        return self._step(0, num_spec, spec_len, 0, None)

    # ------------------------------------------------------------------ host side, no buffer touched

    def _build(self, num_computed, num_scheduled, block_tables, pad_decodes_to, spec=None,
               rings=None, accepted=None, pad_spec_to=None):
        L = self.limits
        B = L.block_size
        ns, qs, tables = self._check_rows(num_computed, num_scheduled, block_tables)
        rows = len(ns)
        d, nsp = classify_rows(qs, spec, varlen=bool(L.lookahead))
        e_spec = d + nsp
        rings, acc = self._check_spec(rows, qs, d, nsp, rings, accepted)
        fast, checked = None, False
        int_table = (isinstance(tables, np.ndarray) and tables.ndim == 2
                     and tables.dtype.kind in "iu" and tables.shape[1] <= L.max_blocks_per_seq)
        if int_table and rows and L.lookahead and nsp == rows:
            fast = lookahead_spec_rows(ns, qs, tables, B, L.lookahead)  # (None: errors below)
        elif int_table and rows and not L.lookahead and d == rows and not any(acc):
            fast = decode_rows(ns, tables, B)
            if fast is not None and not _decode_slots_ok(*fast, L.num_slots):
                fast = None  # check_step_slots below names the row
            if fast is not None:
                fast = (*fast, [[]] * rows)
                checked = True
        if fast is not None:
            reads, writes, ckpts = fast
        else:
            reads, writes, ckpts = [], [], []
            for i in range(rows):
                r, w, ck = self._row_slots(i, ns[i], qs[i], tables[i], rings[i], acc[i],
                                           d <= i < e_spec)
                reads.append(r)
                writes.append(w)
                ckpts.append(ck)

        def entry(i: int, kind: str, e: int) -> str:  # the table entry a slot came from
            n = ns[i]
            if L.lookahead and (kind == "read" or d <= i < e_spec or kind == "write"):
                m = n if kind == "read" else n + 1 + e if kind == "ckpt" else n + qs[i]
                return f"block table entry {lookahead_column(m, B, L.lookahead)}"
            if d <= i < e_spec and kind != "read":
                m = n + 1 + e if kind == "ckpt" else n + qs[i]
                return (f"block table entry {m // B - 1}" if m % B == 0
                        else f"ring entry {m % len(rings[i])}")
            if kind == "read" and acc[i] and n % B:
                return f"ring entry {n % len(rings[i])}"
            blocks = {"read": read_block(n, B), "write": write_block(n, qs[i], B)}
            return f"block table entry {blocks.get(kind, n // B + e)}"

        if not checked:
            check_step_slots(reads, writes, ckpts, L.num_slots, where=entry)
        padded = self._padded_rows("pad_decodes_to", pad_decodes_to, d, rows, qs)
        padded_spec = self._padded_rows("pad_spec_to", pad_spec_to, nsp, rows, qs, d)
        spec_len = max(qs[d:e_spec]) if nsp else 0
        if padded_spec and not spec_len:
            raise ValueError("pad_spec_to needs at least one spec row (it sets the row length)")
        if padded_spec > nsp and min(qs[d:e_spec]) != spec_len:
            raise ValueError("pad_spec_to needs spec rows of one length (a graph's rows)")
        if sum(qs) + (padded_spec - nsp) * spec_len + padded - d > L.max_tokens:
            raise ValueError(f"padded batch exceeds max_tokens={L.max_tokens}")

        meta_lists = None
        num_chunks = num_ckpts = 0
        if e_spec < rows:  # (the slots of every row were checked above)
            sl = slice(e_spec, rows)
            meta_lists = host_chunk_meta(qs[sl], ns[sl], reads[sl], writes[sl], ckpts[sl],
                                         L.block_size, max_seqs=L.max_seqs,
                                         max_chunks=L.max_chunks, max_ckpts=L.max_ckpts,
                                         check_slots=False)
            num_ckpts = sum(len(c) for c in ckpts[sl])
            num_chunks = sum(_num_chunks(n, q) for n, q in zip(ns[sl], qs[sl]))
        total = sum(qs)
        host = StepPlan(
            num_decodes=d, num_spec=nsp, spec_len=spec_len, padded_spec=padded_spec,
            num_prefills=rows - e_spec, num_prefill_tokens=sum(qs[e_spec:]),
            num_tokens=total, padded_decodes=padded, num_chunks=num_chunks, num_ckpts=num_ckpts,
            decode_read=tuple(reads[:d]), decode_write=tuple(writes[:d]),
            prefill_read=tuple(reads[e_spec:]), prefill_write=tuple(writes[e_spec:]),
            prefill_ckpts=tuple(tuple(c) for c in ckpts[e_spec:]),
            spec_read=tuple(reads[d:e_spec]),
            spec_write=tuple((*ckpts[i], writes[i]) for i in range(d, e_spec)),
            spec_accepted=tuple(acc[d:e_spec]), prefill_starts=tuple(ns[e_spec:]))
        return host, meta_lists

    def _check_spec(self, rows, qs, d, nsp, rings, accepted):
        """The spec arguments as per-row lists (rings[i] a list of ints or None, acc[i] an int)."""
        L = self.limits
        if rings is None and accepted is None and not nsp:
            return [None] * rows, [0] * rows  # (what the loop below gives: nothing to check)
        rings = [None] * rows if rings is None else list(rings)
        acc = [0] * rows if accepted is None else _as_list(accepted)
        if len(rings) != rows or len(acc) != rows:
            raise ValueError(f"rings and accepted need one entry per row ({rows}), got "
                             f"{len(rings)} and {len(acc)}")
        if nsp and not L.max_spec_len:
            raise ValueError("spec rows need a planner with PlanLimits.max_spec_len > 0")
        longest = max(range(d, d + nsp), key=lambda i: qs[i], default=d)
        if nsp and qs[longest] > L.max_spec_len:
            raise ValueError(f"row {longest}: spec rows of {qs[longest]} tokens, more than "
                             f"max_spec_len={L.max_spec_len}")
        for i in range(rows):
            a = acc[i]
            if not _is_int(a) or a < 0:
                raise ValueError(f"row {i}: accepted must be an int >= 0, got {a!r}")
            acc[i] = int(a)
            # (the lookahead layout places states by position: no ring, accepted unused)
            need_ring = (d <= i < d + nsp or acc[i] > 0) and not L.lookahead
            if rings[i] is None:
                if need_ring:
                    raise ValueError(f"row {i}: needs a ring (a spec row, or accepted > 0)")
                continue
            ring = _as_list(rings[i])
            if not all(_is_int(x) for x in ring):
                raise ValueError(f"row {i}: ring entries must be ints, got {ring!r}")
            rings[i] = [int(x) for x in ring]
            if need_ring and len(ring) < (qs[i] + 1 if d <= i < d + nsp else acc[i] + 1):
                raise ValueError(f"row {i}: a ring of {len(ring)} slots is too small (a spec row "
                                 f"of q tokens needs q + 1, accepted = a needs a + 1)")
            if len(set(rings[i])) != len(ring):
                raise ValueError(f"row {i}: ring slots must be distinct, got {ring}")
        return rings, acc

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
        # integer arrays (vLLM's builder) are checked at once; _as_list made them Python ints
        if not (isinstance(num_computed, np.ndarray) and isinstance(num_scheduled, np.ndarray)
                and num_computed.ndim == num_scheduled.ndim == 1
                and num_computed.dtype.kind in "iu" and num_scheduled.dtype.kind in "iu"
                and (num_scheduled >= 1).all() and (num_computed >= 0).all()):
            for i, (n, q) in enumerate(zip(ns, qs)):
                if not _is_int(n) or not _is_int(q):
                    raise ValueError(f"row {i}: num_computed and num_scheduled must be ints, got "
                                     f"{n!r}, {q!r}")
                if q < 1 or n < 0:
                    raise ValueError(f"row {i}: needs num_scheduled >= 1 and num_computed >= 0, "
                                     f"got q={q}, n={n}")
            ns, qs = [int(n) for n in ns], [int(q) for q in qs]  # numpy scalars -> int
        total = sum(qs)
        if total > L.max_tokens:
            raise ValueError(f"batch schedules {total} tokens, more than max_tokens={L.max_tokens}")
        return ns, qs, tables

    def _row_slots(self, i: int, n: int, q: int, row, ring, accepted: int,
                   is_spec: bool) -> tuple[int, int, list[int]]:
        """Row i's read slot, write slot and checkpoint slots (step.py's block arithmetic), from
        the table entries it uses, which must be ints (check_step_slots checks their range). A
        spec row's "checkpoints" are the slots after its tokens 0 .. q-2 and its write slot the
        one after token q-1 (spec_write_slots)."""
        L = self.limits
        B = L.block_size
        width = len(row)
        if width > L.max_blocks_per_seq:
            raise ValueError(f"row {i}: block table has {width} entries, more than "
                             f"max_blocks_per_seq={L.max_blocks_per_seq}")
        if L.lookahead:
            return lookahead_row_slots(i, n, q, row, B, L.lookahead, is_spec)
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
        table = {lo + j: s for j, s in enumerate(used)}
        r = row_read_slot(n, table, B, ring, accepted)
        if n > 0 and r == NO_SLOT:
            raise ValueError(f"row {i}: read slot is {NO_SLOT} but n={n} > 0 tokens were computed")
        if is_spec:
            ws = spec_write_slots(n, q, table, ring, B)
            for j, m in enumerate(range(n + 1, n + q + 1)):
                if ws[j] == NO_SLOT:
                    raise ValueError(f"row {i}: the state after {m} tokens goes to block table "
                                     f"entry {m // B - 1}, which is {NO_SLOT}")
            return r, ws[-1], ws[:-1]
        w = used[-1]
        if w == NO_SLOT:
            raise ValueError(f"row {i}: write slot table[{last}] is {NO_SLOT}")
        ckpts = [NO_SLOT if used[c - lo] == w else used[c - lo] for c in checkpoint_blocks(n, q, B)]
        return r, w, ckpts

    def _padded_rows(self, arg: str, pad_to, num: int, rows: int, qs, first: int = 0) -> int:
        """Rows of one kind (``num`` of them, from row ``first``) to launch: ``pad_to`` when given,
        for a batch of that kind only."""
        if pad_to is None:
            return num
        if not _is_int(pad_to):
            raise ValueError(f"{arg} must be an int, got {pad_to!r}")
        if first + num < rows or first:
            bad = first + num if first + num < rows else 0
            raise ValueError(f"{arg} is only for batches of one row kind, but row {bad} "
                             f"schedules {qs[bad]} tokens as another kind")
        if pad_to < num:
            raise ValueError(f"{arg}={pad_to} is smaller than the {num} rows")
        if pad_to > self.limits.max_seqs:
            raise ValueError(f"{arg}={pad_to} is larger than max_seqs={self.limits.max_seqs}")
        return pad_to

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
        if self.limits.max_spec_len:
            self._stage_spec(st, step)
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

    def _stage_spec(self, st: np.ndarray, step: StepPlan) -> None:
        """The spec buffers of ``step`` into the staging array ``st`` (tails included)."""
        S, Lmax = self.limits.max_seqs, self.limits.max_spec_len
        ns, L = step.num_spec, step.spec_len
        o, _ = self._spans["spec_read"]
        st[o:o + S] = NO_SLOT
        st[o:o + ns] = step.spec_read
        o, _ = self._spans["spec_write"]
        st[o:o + S * Lmax] = NO_SLOT
        w = st[o:o + S * Lmax].reshape(S, Lmax)
        lens = [len(ws) for ws in step.spec_write]
        for r, ws in enumerate(step.spec_write):  # (rows may differ in length: lookahead layout)
            w[r, :len(ws)] = ws
        o, _ = self._spans["spec_cu"]
        launched = step.padded_spec
        # real rows at their lengths, padded rows (one length, a graph) at L each, then repeating
        cu = np.concatenate(([0], np.cumsum(lens + [L] * (launched - ns)),
                             np.full(S - launched, sum(lens) + L * (launched - ns))))
        st[o:o + S + 1] = cu
        o, _ = self._spans["spec_accepted"]
        st[o:o + S] = 0
        st[o:o + ns] = step.spec_accepted

