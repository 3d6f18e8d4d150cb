"""Prefill metadata shared by the chunk and conv kernels: what a varlen batch looks like on the device.

The kernels know nothing of requests or block tables. They see, per sequence ``i`` of the batch:
    cu_seqlens[i] .. cu_seqlens[i+1]   its tokens in the flat token arrays
    start_pos[i]                       n: how many tokens of it were computed before this step
    read_slot[i], write_slot[i]        pool slot of the state after n tokens (-1: zeros) and of the
                                       state after the last scheduled token (-1: store nothing)
    ckpt_offsets[i] .. ckpt_offsets[i+1]  entries of ckpt_slots: entry e is the slot of the state
                                       after p_e = (n // B + 1 + e) * B tokens, for every multiple
                                       of B strictly inside (n, n + q); -1 stores nothing
and a chunk table: program ``c`` of a chunk-parallel kernel handles chunk ``chunk_idx[c]`` of
sequence ``chunk_seq[c]`` (-1: idle, exit at once). Chunks are aligned to absolute positions, so
chunk j of a sequence covers absolute positions [(n // 64 + j) * 64, (n // 64 + j + 1) * 64)
clipped to [n, n + q): a span that starts mid-chunk first finishes that chunk.

All tensors are int32 and may be longer than the live batch (persistent buffers sized for the
maximum): the tail of cu_seqlens / ckpt_offsets repeats the last value, start_pos is 0 there and
every other tail entry is -1. Launch grids depend only on the buffer lengths, so a captured graph replays any batch.
A ChunkMeta built on the host (make_chunk_meta, chunk_meta) also carries its host totals,
``num_seqs`` and ``num_tokens``, so that a launcher refuses tensors too short for it before any
launch; the planner's persistent buffers have none (their totals change every plan; the GDNStep
carries them).

Slot values are checked on the host by ``check_step_slots``, the one validator of every builder
that holds them there (the planner, host_chunk_meta): slots inside [-1, num_slots), no slot
written twice in a step, no row reading a slot that another row writes. The kernels themselves
only guarantee memory safety (gdn_graphs.ops.common: the error flag).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, Sequence

import torch

from gdn_graphs.constants import CHUNK, NO_SLOT


@dataclass(frozen=True)
class ChunkMeta:
    """Device-side description of a varlen prefill batch (see the module docstring)."""

    cu_seqlens: torch.Tensor    # [max_seqs + 1] int32
    start_pos: torch.Tensor     # [max_seqs] int32
    read_slot: torch.Tensor     # [max_seqs] int32
    write_slot: torch.Tensor    # [max_seqs] int32
    ckpt_offsets: torch.Tensor  # [max_seqs + 1] int32
    ckpt_slots: torch.Tensor    # [max_ckpts] int32 (at least 1 long)
    chunk_seq: torch.Tensor     # [max_chunks] int32
    chunk_idx: torch.Tensor     # [max_chunks] int32
    block_size: int             # B, a multiple of CHUNK
    # host totals of a batch built on the host (None for persistent buffers): live sequences,
    # and the end of the furthest span (cu_seqlens' largest value)
    num_seqs: Optional[int] = None
    num_tokens: Optional[int] = None

    # the fields that hold pool slots (an engine with several pools rewrites only these)
    SLOT_FIELDS: ClassVar[tuple[str, ...]] = ("read_slot", "write_slot", "ckpt_slots")
    # the fields that are host values, not tensors
    HOST_FIELDS: ClassVar[tuple[str, ...]] = ("block_size", "num_seqs", "num_tokens")

    @classmethod
    def tensor_fields(cls) -> tuple[str, ...]:
        """Names of the int32 tensors, in declaration order (host_chunk_meta's keys)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.HOST_FIELDS)

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.tensor_fields()]

    @property
    def max_seqs(self) -> int:
        return self.read_slot.shape[0]

    @property
    def max_chunks(self) -> int:
        return self.chunk_seq.shape[0]


def num_chunks(start: int, length: int) -> int:
    """Chunks that a span of ``length`` tokens starting at absolute position ``start`` touches."""
    if length <= 0:
        return 0
    return (start + length - 1) // CHUNK - start // CHUNK + 1


def num_checkpoints(start: int, length: int, block_size: int) -> int:
    """Multiples of ``block_size`` strictly inside (start, start + length)."""
    if length <= 0:
        return 0
    return (start + length - 1) // block_size - start // block_size


def max_chunks_bound(max_tokens: int, max_seqs: int) -> int:
    """Upper bound on the chunks of any batch within these limits (each sequence adds at most
    one partial chunk at each end)."""
    return max_tokens // CHUNK + 2 * max_seqs


def max_ckpts_bound(max_tokens: int, max_seqs: int, block_size: int) -> int:
    """Upper bound on the checkpoints of any batch within these limits."""
    return max(1, max_tokens // block_size + max_seqs)


def _slot_name(i: int, kind: str, e: int) -> str:
    return {"read": "read slot", "write": "write slot"}.get(kind, f"checkpoint slot {e}")


def check_step_slots(reads: Sequence[int], writes: Sequence[int], ckpts: Sequence[Sequence[int]],
                     num_slots: int | None = None,
                     where: Callable[[int, str, int], str] | None = None) -> None:
    """The slot rules of one step, checked on the host (GDNPlanner and host_chunk_meta use this).

    Row i reads ``reads[i]`` and writes ``writes[i]`` and the entries of ``ckpts[i]`` (NO_SLOT:
    nothing). Raises ValueError, naming the first offending row, when
      * a slot is below NO_SLOT, or ``num_slots`` is given and a slot is not below it;
      * a slot is written twice in the step (twice by one row, or by two rows);
      * a row reads a slot that another row writes (that would corrupt its starting state).
    A row may read a slot it writes itself (decode in place; a first checkpoint in the block it
    resumes from). ``where(i, kind, e)`` names a slot in the range message (kind "read", "write"
    or "ckpt", e the checkpoint's index): the planner names block-table entries.
    """
    top = float("inf") if num_slots is None else num_slots
    top_name = "num_slots" if num_slots is None else num_slots
    writer: dict[int, int] = {}
    for i, (r, w, ck) in enumerate(zip(reads, writes, ckpts)):
        if not (NO_SLOT <= r < top and NO_SLOT <= w < top and all(NO_SLOT <= s < top for s in ck)):
            where = where or _slot_name
            for kind, e, s in (("read", 0, r), *(("ckpt", e, s) for e, s in enumerate(ck)),
                               ("write", 0, w)):  # in table order
                if s < NO_SLOT or s >= top:
                    raise ValueError(f"row {i}: {where(i, kind, e)} = {s} is outside "
                                     f"[{NO_SLOT}, {top_name})")
        for s in (w, *ck):
            if s == NO_SLOT:
                continue
            j = writer.get(s)
            if j == i:
                raise ValueError(f"row {i}: writes slot {s} twice in one step")
            if j is not None:
                raise ValueError(f"row {i}: writes slot {s}, which row {j} also writes")
            writer[s] = i
    for i, r in enumerate(reads):
        if r != NO_SLOT:
            j = writer.get(r, i)
            if j != i:
                raise ValueError(f"row {i}: reads slot {r}, which row {j} writes in the same step")


def host_chunk_meta(
    seqlens: Sequence[int],
    start_pos: Sequence[int],
    read_slot: Sequence[int],
    write_slot: Sequence[int],
    ckpt_slots: Sequence[Sequence[int]],
    block_size: int,
    max_seqs: int | None = None,
    max_chunks: int | None = None,
    max_ckpts: int | None = None,
    *,
    num_slots: int | None = None,
    check_slots: bool = True,
) -> dict[str, list[int]]:
    """Host lists for a ChunkMeta, padded to the given maxima (default: exactly the live size).

    ``ckpt_slots[i]`` must hold exactly num_checkpoints(start_pos[i], seqlens[i], block_size)
    entries. Raises ValueError on anything inconsistent, and on slots that ``check_step_slots``
    refuses (written twice, read by one sequence and written by another, and with ``num_slots``
    outside [-1, num_slots)); ``check_slots=False`` skips that for a caller that ran it already
    (the planner, over every row of its step).
    """
    n = len(seqlens)
    if not (len(start_pos) == len(read_slot) == len(write_slot) == len(ckpt_slots) == n):
        raise ValueError("seqlens, start_pos, read_slot, write_slot and ckpt_slots differ in length")
    if block_size <= 0 or block_size % CHUNK:
        raise ValueError(f"block_size must be a positive multiple of {CHUNK}, got {block_size}")
    cu, ck_off, ck, cseq, cidx = [0], [0], [], [], []
    for i, (q, s) in enumerate(zip(seqlens, start_pos)):
        if q < 1 or s < 0:
            raise ValueError(f"sequence {i}: needs at least one token and start_pos >= 0, got q={q}, n={s}")
        want = num_checkpoints(s, q, block_size)
        if len(ckpt_slots[i]) != want:
            raise ValueError(f"sequence {i}: expected {want} checkpoint slots, got {len(ckpt_slots[i])}")
        cu.append(cu[-1] + q)
        ck.extend(int(x) for x in ckpt_slots[i])
        ck_off.append(len(ck))
        for j in range(num_chunks(s, q)):
            cseq.append(i)
            cidx.append(j)
    if check_slots:
        check_step_slots([int(r) for r in read_slot], [int(w) for w in write_slot],
                         [[int(x) for x in c] for c in ckpt_slots], num_slots)
    max_seqs = n if max_seqs is None else max_seqs
    max_chunks = len(cseq) if max_chunks is None else max_chunks
    max_ckpts = max(1, len(ck)) if max_ckpts is None else max_ckpts
    if n > max_seqs or len(cseq) > max_chunks or len(ck) > max_ckpts:
        raise ValueError(
            f"batch needs {n} seqs / {len(cseq)} chunks / {len(ck)} checkpoints, buffers hold "
            f"{max_seqs} / {max_chunks} / {max_ckpts}")

    def pad(xs, size, fill):
        return list(xs) + [fill] * (size - len(xs))

    return dict(
        cu_seqlens=pad(cu, max_seqs + 1, cu[-1]),
        start_pos=pad(start_pos, max_seqs, 0),
        read_slot=pad(read_slot, max_seqs, NO_SLOT),
        write_slot=pad(write_slot, max_seqs, NO_SLOT),
        ckpt_offsets=pad(ck_off, max_seqs + 1, ck_off[-1]),
        ckpt_slots=pad(ck, max_ckpts, NO_SLOT),
        chunk_seq=pad(cseq, max_chunks, -1),
        chunk_idx=pad(cidx, max_chunks, -1),
    )


def make_chunk_meta(device, block_size: int, **lists) -> ChunkMeta:
    """Fresh device tensors from host_chunk_meta's lists: for eager use and tests. The planner
    copies the same lists into its persistent buffers instead. The ChunkMeta carries the host
    totals of the lists: its live sequences (spans of at least one token) and the end of its
    furthest span (the largest cu_seqlens value), which the launchers check against T."""
    cu = [int(x) for x in lists["cu_seqlens"]]
    num_seqs = sum(b > a for a, b in zip(cu, cu[1:]))
    t = {k: torch.tensor(v, dtype=torch.int32, device=device) for k, v in lists.items()}
    return ChunkMeta(block_size=block_size, num_seqs=num_seqs, num_tokens=max(cu), **t)


def chunk_meta(seqlens, start_pos, read_slot, write_slot, ckpt_slots, block_size, device="cpu",
               num_slots=None, **maxima) -> ChunkMeta:
    """host_chunk_meta + make_chunk_meta in one call (``num_slots``: also range-check the slots)."""
    lists = host_chunk_meta(seqlens, start_pos, read_slot, write_slot, ckpt_slots, block_size,
                            num_slots=num_slots, **maxima)
    return make_chunk_meta(device, block_size, **lists)
