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

Row kinds (``classify_rows``, the one classifier): the leading rows that schedule exactly one
token and are not speculative are decode rows (decode kernel, their tokens first in the flat
batch); then the speculative rows (rows the caller marks ``spec``, each verifying 1 + k tokens,
the same k for all of them: multi-token decode kernels); every later row is a prefill row (chunk
kernels), whatever its length. The flat token batch of a step is therefore
``[decode rows | spec rows (1 + k tokens each) | prefill tokens | padding]``.

Speculative rows (README "Conventions", speculative decoding). A request that decodes
speculatively owns a ring of R >= k + 2 private slots (never in the prefix cache). A spec row
with n computed tokens and q = 1 + k scheduled stores the state after every one of its tokens:

    state after m tokens (m = n + 1 .. n + q)   table[m // B - 1]   when m % B == 0 (block slot)
                                                ring[m % R]          otherwise

After the caller verifies the row and accepts a tokens (1 <= a <= q), the state after n + a is
where this rule put it; the next step of that request, whatever its kind, says ``accepted = a``
and reads

    read slot   ring[n % R]            when accepted > 0 and n % B != 0
                table[(n - 1) // B]    otherwise (the ordinary rule)

(``spec_write_slots`` and ``row_read_slot`` implement both). A spec row writes no final slot of
its own: its last token's entry above is its final state.

Lookahead layout (vLLM with speculative decoding; README "Conventions"). An engine that cannot
give a request a ring outside its block table (vLLM: a request's pages are its table's columns,
appended in order) and cannot tell the host how many drafts the previous step accepted keeps
R >= k + 1 private columns ahead of the current block instead, and places the state after m
tokens by m alone, for every row kind (c = m // B, the block holding token m):

    state after m tokens    table[c - 1]                      when m % B == 0 (block slot)
                            table[c + 1 + (m - c) % R]        otherwise (``lookahead_column``)

(the residue shifts by one per block, so that the k + 1 positions of a span that crosses a
boundary never meet in one column: README "Conventions").

Every row reads the state after n from there and stores its final state there; a spec row also
stores the state after each of its tokens there; prefill checkpoints stay ``table[p // B - 1]``.
Spec rows may then have any length 1 .. max_spec_len in one step (the drafts a request got).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.meta import ChunkMeta

__all__ = ["read_block", "write_block", "checkpoint_blocks", "classify_rows", "count_decode_rows",
           "row_read_slot", "spec_write_slots", "lookahead_column", "lookahead_row_slots",
           "lookahead_spec_rows", "decode_rows",
           "StepPlan", "GDNStep"]


def read_block(n: int, B: int) -> int:
    """Block holding the state after ``n`` tokens; -1 when n == 0 (nothing to read)."""
    return (n - 1) // B if n > 0 else -1


def write_block(n: int, q: int, B: int) -> int:
    """Block receiving the state after ``n + q`` tokens."""
    return (n + q - 1) // B


def checkpoint_blocks(n: int, q: int, B: int) -> range:
    """Blocks receiving the states at the multiples of B strictly inside (n, n + q)."""
    return range(n // B, write_block(n, q, B))


def lookahead_column(m: int, B: int, R: int) -> int:
    """Block-table column of the state after ``m`` >= 1 tokens in the lookahead layout (module
    docstring): a boundary state in its block's column, any other in one of the R columns after
    the block holding token m - 1."""
    c = m // B
    return c - 1 if m % B == 0 else c + 1 + (m - c) % R


def classify_rows(num_scheduled: Sequence[int], spec: Optional[Sequence[bool]] = None,
                  varlen: bool = False) -> tuple[int, int]:
    """(decode rows, spec rows) of a step: the leading non-spec rows that schedule exactly one
    token, then the rows marked ``spec[i]`` that follow them; every later row is a prefill row.
    Raises ValueError for a spec row after a prefill row or, unless ``varlen``, spec rows of
    different lengths."""
    rows = len(num_scheduled)
    if spec is not None and len(spec) != rows:
        raise ValueError(f"spec has {len(spec)} entries for {rows} rows")
    if spec is None and list(num_scheduled).count(1) == rows:
        return rows, 0  # every row decodes one token (the common step, without a Python loop)
    is_spec = (lambda i: False) if spec is None else (lambda i: bool(spec[i]))
    nd = 0
    while nd < rows and num_scheduled[nd] == 1 and not is_spec(nd):
        nd += 1
    ns = nd
    while ns < rows and is_spec(ns):
        if not varlen and num_scheduled[ns] != num_scheduled[nd]:
            raise ValueError(f"row {ns}: spec rows must all schedule 1 + k tokens with one k, "
                             f"got {num_scheduled[ns]} and {num_scheduled[nd]}")
        ns += 1
    for i in range(ns, rows):
        if is_spec(i):
            raise ValueError(f"row {i}: a spec row must come before every prefill row "
                             f"(rows are [decode | spec | prefill])")
    return nd, ns - nd


def count_decode_rows(num_scheduled: Sequence[int], spec: Optional[Sequence[bool]] = None) -> int:
    """Decode rows of a step (``classify_rows``' first count)."""
    return classify_rows(num_scheduled, spec)[0]


def row_read_slot(n: int, table: Sequence[int], B: int, ring: Optional[Sequence[int]] = None,
                  accepted: int = 0) -> int:
    """Slot holding the state after ``n`` tokens: the ring's when the previous step was a spec
    row (``accepted`` > 0) that left it off a block boundary, else the block table's."""
    if n == 0:
        return -1
    if accepted > 0 and n % B:
        return int(ring[n % len(ring)])
    return int(table[(n - 1) // B])


def spec_write_slots(n: int, q: int, table: Sequence[int], ring: Sequence[int], B: int) -> list[int]:
    """Slot of the state after each token of a spec row (entry j: after n + j + 1 tokens)."""
    R = len(ring)
    out = []
    for m in range(n + 1, n + q + 1):
        out.append(int(table[m // B - 1]) if m % B == 0 else int(ring[m % R]))
    return out


def lookahead_row_slots(i: int, n: int, q: int, row, B: int, R: int,
                        is_spec: bool) -> tuple[int, int, list[int]]:
    """Row i's read, write and checkpoint slots in the lookahead layout (step.py): the state
    after m tokens at ``row[lookahead_column(m)]``; a spec row's checkpoints are its tokens'
    states before the last, a prefill row's its block boundaries strictly inside (n, n + q)."""
    width = len(row)
    ms = range(n + 1, n + q + 1) if is_spec else (n + q,)
    cols = ([lookahead_column(n, B, R)] if n else []) + [lookahead_column(m, B, R) for m in ms]
    if not is_spec:
        cols += checkpoint_blocks(n, q, B)
    for col in cols:
        if col >= width:
            raise ValueError(f"row {i}: block table has {width} entries but n={n}, q={q} needs "
                             f"entry {col} (B={B}, lookahead {R})")
    if isinstance(row, np.ndarray) and row.dtype.kind in "iu":
        vals = row[cols].tolist()  # one gather, Python ints (the planner's placeholder rows)
    else:
        vals = []
        for col in cols:
            s = row[col]
            if not isinstance(s, numbers.Integral):
                raise ValueError(f"row {i}: block table entry {col} is not an int: {s!r}")
            vals.append(int(s))

    def need(j: int, what: str) -> int:  # a state the row reads or keeps must have a slot
        if vals[j] == NO_SLOT:
            raise ValueError(f"row {i}: {what} goes to block table entry {cols[j]}, which is "
                             f"{NO_SLOT}")
        return vals[j]

    r = need(0, "the state it reads") if n else NO_SLOT
    o = 1 if n else 0
    if is_spec:
        ws = [need(o + t, f"the state after {m} tokens") for t, m in enumerate(ms)]
        return r, ws[-1], ws[:-1]
    w = need(o, "its final state")
    return r, w, [NO_SLOT if c == w else c for c in vals[o + 1:]]


def decode_rows(ns: Sequence[int], tables: np.ndarray, B: int
                ) -> Optional[tuple[list[int], list[int]]]:
    """Every row a decode row (one token, no ring): (reads, writes) as the planner's row-by-row
    path gives them (``row_read_slot``, ``write_block``; a decode row passes no block boundary,
    so it has no checkpoint), in a few numpy operations over the [rows, width] integer table (the
    planner's hot path: every decode step of vLLM and of the embedded engine). None when any row
    would fail there: the caller then runs that path, which names the error."""
    n = np.asarray(ns, dtype=np.int64)
    wcol, rcol = n // B, np.maximum(n - 1, 0) // B
    if len(n) and int(wcol.max()) >= tables.shape[1]:
        return None
    rows = np.arange(len(n))
    w = tables[rows, wcol]
    r = np.where(n > 0, tables[rows, rcol], NO_SLOT)
    if (w == NO_SLOT).any() or ((r == NO_SLOT) & (n > 0)).any():
        return None
    return r.tolist(), w.tolist()


def lookahead_spec_rows(ns: Sequence[int], qs: Sequence[int], tables: np.ndarray, B: int,
                        R: int) -> Optional[tuple[list[int], list[int], list[list[int]]]]:
    """Every row a spec row, in the lookahead layout: (reads, writes, checkpoints) as
    ``lookahead_row_slots`` gives them row by row, in a few numpy operations over the [rows,
    width] integer table (the planner's hot path in vLLM: a decode step with drafts). None when
    any row would fail there: the caller then runs that path, which names the error."""
    n, q = np.asarray(ns, dtype=np.int64), np.asarray(qs, dtype=np.int64)
    m = n[:, None] + np.arange(1, int(q.max()) + 1)  # [rows, Q]: the states after m tokens
    live = m <= (n + q)[:, None]
    c, cn = m // B, n // B
    cols = np.where(live, np.where(m % B == 0, c - 1, c + 1 + (m - c) % R), 0)
    has_read = n > 0
    rcol = np.where(has_read, np.where(n % B == 0, cn - 1, cn + 1 + (n - cn) % R), 0)
    if (cols >= tables.shape[1]).any() or (rcol >= tables.shape[1]).any():
        return None
    rows = np.arange(len(n))
    w = tables[rows[:, None], cols]
    r = np.where(has_read, tables[rows, rcol], NO_SLOT)
    if ((w == NO_SLOT) & live).any() or ((r == NO_SLOT) & has_read).any():
        return None
    wl = w.tolist()
    writes = [wl[i][qi - 1] for i, qi in enumerate(q.tolist())]
    ckpts = [wl[i][:qi - 1] for i, qi in enumerate(q.tolist())]
    return r.tolist(), writes, ckpts


@dataclass(frozen=True)
class StepPlan:
    """Host-side summary of a validated step (slots as the kernels see them)."""

    num_decodes: int
    num_spec: int                        # spec rows (after the decodes, before the prefills)
    spec_len: int                        # tokens of each spec row (1 + k; 0 without spec rows)
    padded_spec: int                     # spec rows to launch (== num_spec unless padded)
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
    spec_read: tuple[int, ...] = ()
    spec_write: tuple[tuple[int, ...], ...] = ()  # per spec row, the slot after each token
    spec_accepted: tuple[int, ...] = ()           # per spec row, the accepted count it read by
    # per prefill row, the tokens computed before the step (start_pos): the FlashInfer prefill
    # path picks its checkpoint interval from them (gdn_graphs.ops.fi_prefill.fi_route)
    prefill_starts: tuple[int, ...] = ()

    @property
    def num_seqs(self) -> int:
        return self.num_decodes + self.num_spec + self.num_prefills

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
    # speculative rows, after the decode rows (gdn_decode_multi / conv_decode_multi): num_spec
    # rows of spec_len tokens each (host ints: they shape the launches; a FULL graph is captured
    # per (num_spec bucket, spec_len)). Persistent int32 views of the planner's buffers:
    num_spec: int = 0
    spec_len: int = 0
    spec_read: Optional[torch.Tensor] = None   # [>= num_spec] read slot of spec row i
    spec_write: Optional[torch.Tensor] = None  # [>= num_spec, >= spec_len] slot after token t
    spec_cu: Optional[torch.Tensor] = None     # [>= num_spec + 1] token offsets: i * spec_len
    # tokens of the launched spec rows when they differ in length (lookahead layout: spec_len is
    # then the longest, spec_cu the real offsets); None: num_spec * spec_len
    spec_tokens: Optional[int] = None

    @property
    def num_spec_tokens(self) -> int:
        return self.num_spec * self.spec_len if self.spec_tokens is None else self.spec_tokens

    @property
    def num_tokens(self) -> int:
        """Tokens the step launches: decode rows (padded) + spec tokens + prefill tokens."""
        return self.num_decodes + self.num_spec_tokens + self.num_prefill_tokens
