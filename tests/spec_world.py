"""A simulated engine for the speculative-row tests (CPU tier under the interpreter, GPU tier):
requests with block tables and rings over one layer's pools, random steps mixing decode rows,
spec rows with every acceptance count and prefill rows, run through the planner and
run_gdn_core, and beside them a "truth" world that runs only the accepted tokens, one at a time,
as plain decode rows (the prefill rows as they are).

``simulate(...)`` asserts, every step: outputs of accepted tokens, decode and prefill rows equal
the truth bit for bit; pool slots outside the step's write set unchanged; every committed block's
slot unchanged by the step and equal to the truth's; and the slot each request reads next holds
the truth's state after its accepted tokens, bit for bit (ssm and conv pools)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from gdn_graphs.ops.workspace import ChunkWorkspace
from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import row_read_slot

B = 64
HK, HV, K, V, W = 1, 2, 16, 16, 4
C = 2 * HK * K + HV * V
MAX_BLOCKS = 4
NUM_SLOTS = 64


def make_layer(device, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    conv_w = (torch.randn(C, W, generator=g) * 0.5).to(device)
    conv_b = (torch.randn(C, generator=g) * 0.1).to(device) if bias else None
    A_log = (torch.rand(HV, generator=g) * 2 - 1).to(device)
    dt_bias = torch.randn(HV, generator=g).to(device)
    return GDNWeights(conv_w, conv_b, A_log, dt_bias)


def make_pools(device, pool_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    conv = torch.randn(NUM_SLOTS, C, W - 1, generator=g).to(device)
    ssm = (torch.randn(NUM_SLOTS, HV, V, K, generator=g) * 0.3).to(pool_dtype).to(device)
    return GDNPools(conv, ssm)


def clone_pools(p: GDNPools) -> GDNPools:
    return GDNPools(p.conv.clone(), p.ssm.clone())


@dataclass
class Req:
    rid: int
    n: int
    prompt_left: int                     # prefill tokens still to run before decoding
    table: list[int]
    ring: list[int]
    accepted: int = 0
    pos_inputs: dict = field(default_factory=dict)


class Sim:
    def __init__(self, device, k: int, pool_dtype=torch.float32, seed: int = 0,
                 num_reqs: int = 3, accept: int | None = None, spec_share: float = 0.7):
        self.device, self.k, self.rng = device, k, random.Random(seed)
        self.accept, self.spec_share = accept, spec_share  # accept: force a (1..k+1)
        self.w = make_layer(device, seed)
        self.real = make_pools(device, pool_dtype, seed)
        self.truth = clone_pools(self.real)
        lim = PlanLimits(max_seqs=8, max_tokens=256, block_size=B, num_slots=NUM_SLOTS,
                         max_blocks_per_seq=MAX_BLOCKS, max_spec_len=k + 1)
        self.planner = GDNPlanner(lim, device)
        self.truth_planner = GDNPlanner(lim, device)
        self.ws = ChunkWorkspace(256, HV, K, V, torch.float32, device, HK=HK)
        self.gen = torch.Generator().manual_seed(seed + 1)
        R = k + 2
        self.reqs = []
        for r in range(num_reqs):
            n = self.rng.choice([0, 1, 60, 62, 63, 64, 100, 126, 127, 128, 130])
            left = self.rng.choice([0, 0, 1, 2, 7, 19]) if n < 140 else 0
            table = [8 * r + b for b in range(MAX_BLOCKS)]
            self.reqs.append(Req(r, n, left, table, [40 + R * r + i for i in range(R)]))

    # ------------------------------------------------------------------ inputs

    def _true(self, req: Req, pos: int):
        if pos not in req.pos_inputs:
            req.pos_inputs[pos] = self._rand()
        return req.pos_inputs[pos]

    def _rand(self):
        g = self.gen
        return (torch.randn(C, generator=g), torch.randn(HV, generator=g),
                torch.randn(HV, generator=g))

    def _forward(self, pools, step, rows_inputs):
        x = torch.stack([t[0] for t in rows_inputs]).to(self.device)
        a = torch.stack([t[1] for t in rows_inputs]).to(self.device)
        b = torch.stack([t[2] for t in rows_inputs]).to(self.device)
        out = torch.empty(x.shape[0], HV, V, device=self.device)
        run_gdn_core(x, a, b, self.w, pools, step, out, self.ws)
        return out.cpu()

    # ------------------------------------------------------------------ one step

    def _choose(self):
        """Rows of a step: (req, kind, q, accepted-if-spec), ordered decode | spec | prefill."""
        dec, spec, pre = [], [], []
        for r in self.reqs:
            if r.n + self.k + 1 > MAX_BLOCKS * B:
                continue
            if r.prompt_left > 1:
                q = min(r.prompt_left, self.rng.choice([2, 3, 9, 20]))
                pre.append((r, "prefill", q, 0))
            elif r.prompt_left == 1 or self.rng.random() >= self.spec_share:
                dec.append((r, "decode", 1, 0))
            else:
                a = self.accept or self.rng.randint(1, self.k + 1)
                spec.append((r, "spec", self.k + 1, a))
        return dec + spec + pre

    def step(self):
        rows = self._choose()
        if not rows:
            return False
        inputs, truth_rows = [], []
        for r, kind, q, a in rows:
            for j in range(q):
                true = self._true(r, r.n + j)
                # a spec row's tokens after the accepted ones are drafts that verification rejects
                inputs.append(true if kind != "spec" or j < a else self._rand())
        step = self.planner.plan([r.n for r, *_ in rows], [q for _, _, q, _ in rows],
                                 [r.table for r, *_ in rows],
                                 spec=[kind == "spec" for _, kind, _, _ in rows],
                                 rings=[r.ring for r, *_ in rows],
                                 accepted=[r.accepted for r, *_ in rows])
        before = clone_pools(self.real)
        out = self._forward(self.real, step, inputs)
        self._check_untouched(before, step.host, rows)
        want = self._truth(rows)
        for (r, kind, q, a), got in zip(rows, self._split(out, rows)):
            keep = a if kind == "spec" else q
            assert torch.equal(got[:keep], want[r.rid]), f"req {r.rid} ({kind}): outputs differ"
        for r, kind, q, a in rows:
            r.n += a if kind == "spec" else q
            r.accepted = a if kind == "spec" else 0
            if kind == "prefill" or (kind == "decode" and r.prompt_left == 1):
                r.prompt_left -= q
        self._check_reads()
        return True

    @staticmethod
    def _split(out, rows):
        off = 0
        for _, _, q, _ in rows:
            yield out[off:off + q]
            off += q

    def _truth(self, rows):
        """The accepted tokens one at a time in the truth world: sub-step 0 runs every row's first
        token as a decode row (prefill rows whole), sub-step j the spec rows with > j accepted."""
        got = {r.rid: [] for r, *_ in rows}
        pos = {r.rid: r.n for r, *_ in rows}
        todo = {r.rid: (a if kind == "spec" else q) for r, kind, q, a in rows}
        first = True
        while any(todo.values()):
            sub = [(r, q if kind == "prefill" and first else 1) for r, kind, q, _ in rows
                   if todo[r.rid] and (first or kind != "prefill")]
            sub.sort(key=lambda t: t[1] > 1)  # decode rows first
            step = self.truth_planner.plan([pos[r.rid] for r, _ in sub], [q for _, q in sub],
                                           [r.table for r, _ in sub])
            ins = [self._true(r, pos[r.rid] + j) for r, q in sub for j in range(q)]
            out = self._forward(self.truth, step, ins)
            off = 0
            for r, q in sub:
                got[r.rid].append(out[off:off + q])
                off += q
                pos[r.rid] += q
                todo[r.rid] -= q
            first = False
        return {rid: torch.cat(v) for rid, v in got.items()}

    # ------------------------------------------------------------------ checks

    def _check_untouched(self, before, host, rows):
        written = set(host.decode_write) | set(host.prefill_write)
        for s in (*host.spec_write, *host.prefill_ckpts):
            written |= set(s)
        for name in ("conv", "ssm"):
            a, b = getattr(before, name), getattr(self.real, name)
            for s in range(NUM_SLOTS):
                if s not in written:
                    assert torch.equal(a[s], b[s]), f"{name} slot {s} outside the plan changed"
        for r in self.reqs:  # committed blocks (full before the step): never written
            for blk in range(r.n // B):
                s = r.table[blk]
                assert s not in written, f"req {r.rid}: committed block {blk} is written"

    def _check_reads(self):
        for r in self.reqs:
            for blk in range(r.n // B):  # committed blocks hold the truth's boundary states
                s = r.table[blk]
                assert torch.equal(self.real.ssm[s], self.truth.ssm[s]), f"req {r.rid} block {blk}"
                assert torch.equal(self.real.conv[s], self.truth.conv[s]), f"req {r.rid} block {blk}"
            if r.n == 0:
                continue
            s = row_read_slot(r.n, r.table, B, r.ring, r.accepted)
            t = r.table[(r.n - 1) // B]
            assert torch.equal(self.real.ssm[s], self.truth.ssm[t]), f"req {r.rid}: next read state"
            assert torch.equal(self.real.conv[s], self.truth.conv[t]), f"req {r.rid}: next window"


def simulate(device, k: int, steps: int, seed: int, pool_dtype=torch.float32, num_reqs=3,
             **kw):
    """Run ``steps`` random steps of a fresh Sim (kw: Sim's accept, spec_share); every check
    above runs on the way. Returns (sim, steps that had rows)."""
    sim = Sim(device, k, pool_dtype, seed, num_reqs, **kw)
    sim._check_reads()
    done = 0
    for _ in range(steps):
        done += sim.step()
    return sim, done
