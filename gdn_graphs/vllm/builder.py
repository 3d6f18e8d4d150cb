"""Version-neutral builder logic: what one vLLM model's GDN layers and metadata builders share, and
how an engine step becomes a ``GDNStep``.

vLLM makes one metadata builder per KV-cache group (Qwen3-Next and Qwen3.5 have three GDN groups)
and calls each one every step. Their tables have one shape and the placeholder plan depends only
on the token counts, so the groups share one ``DeviceTablePlanner`` (one host plan per step) and
each gathers its own block ids into its own ``SlotSet``. The planner, the chunk workspace and the
record of kernel warm-ups live in a ``GDNResources``, one per model instance (the model class
makes it; builders reach it through the layers vLLM registers), so nothing is module-global.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from gdn_graphs.ops.chunk import ChunkWorkspace
from gdn_graphs.ops.fi_prefill import fi_capture, make_fi_workspace
from gdn_graphs.runtime.step import GDNStep
from gdn_graphs.vllm.slots import DeviceTablePlanner

__all__ = ["GDNResources", "StepBuilder", "spec_lookahead"]


def spec_lookahead(k: int) -> int:
    """R, the private columns ahead of a request's current block that speculative decoding with
    k drafts needs (k + 1: README "Conventions", the lookahead layout)."""
    return k + 1

_log = logging.getLogger("vllm.gdn_graphs")
# prefill rows one FlashInfer call takes (its initial/final states: 2 MiB each at HV 32): a step
# with more runs its rows in groups of this many, one call (graph replay) each
FI_MAX_SEQS = 64


class GDNResources:
    """Shared by the GDN layers and builders of one model: the placeholder planner, one chunk
    workspace per shape and the warm-ups done.

    max_reqs: rows of a step (a CUDA-graph bucket may pad a decode batch past max_num_seqs);
    max_tokens: tokens of a step; num_spec_tokens: k of speculative decoding (0: off), whose rows
    of up to 1 + k tokens use the lookahead layout with ``lookahead`` = k + 1 columns
    (gdn_graphs.runtime.step; README "Conventions").
    """

    def __init__(self, max_reqs: int, max_tokens: int, num_spec_tokens: int = 0,
                 fi_prefill: bool = False):
        self.max_reqs, self.max_tokens = max_reqs, max_tokens
        self.num_spec_tokens = k = num_spec_tokens
        self.max_spec_len, self.lookahead = (k + 1, spec_lookahead(k)) if k else (0, 0)
        self.fi_prefill = fi_prefill  # the "prefill": "flashinfer" option (see workspace)
        self._planner: DeviceTablePlanner | None = None
        self._planner_key: tuple | None = None
        self._workspaces: dict[tuple, ChunkWorkspace] = {}
        self.warmed_up: set = set()   # warm_up_kernels' record (``done``)

    def planner(self, block_size: int, table_width: int, null_block: int,
                device: torch.device) -> DeviceTablePlanner:
        """The planner of every GDN group (made by the first builder, sized by its arguments)."""
        key = (block_size, table_width, null_block, str(device))
        if self._planner is None:
            self._planner = DeviceTablePlanner(self.max_reqs, self.max_tokens, block_size, None,
                                               table_width, null_block=null_block, device=device,
                                               max_spec_len=self.max_spec_len,
                                               lookahead=self.lookahead)
            self._planner_key = key
        elif key != self._planner_key:
            raise ValueError(f"GDN groups disagree on (block size, table width, null block, "
                             f"device): {key} against {self._planner_key}")
        return self._planner

    def workspace(self, HV: int, K: int, V: int, HK: int, dtype: torch.dtype,
                  device: torch.device, state_dtype: torch.dtype | None = None) -> ChunkWorkspace:
        """The chunk kernels' scratch, one per (shape, dtype, device), shared by every layer.
        With ``state_dtype`` (the pool's) and the "flashinfer" prefill option it carries a
        FiWorkspace where FlashInfer's prefill path can run (SM90, FlashInfer importable, fp32
        pool, K = V = 128): logged once."""
        key = (HV, K, V, HK, dtype, str(device))
        ws = self._workspaces.get(key)
        if ws is None:
            ws = self._workspaces[key] = ChunkWorkspace(self.max_tokens, HV, K, V, dtype, device,
                                                        HK=HK)
            if state_dtype is not None and self.fi_prefill:
                ws.fi, why = make_fi_workspace(self.max_tokens, min(self.max_reqs, FI_MAX_SEQS), HK,
                                               HV, K, V, dtype, state_dtype, device)
                _log.info("gdn_graphs: GDN prefill on %s", (
                    f"FlashInfer's kernel (steps whose starts are 64-aligned; ours otherwise; "
                    f"workspace {ws.fi.nbytes() / 2**20:.0f} MiB)") if ws.fi is not None else
                    f"our Triton kernel ({why})")
        return ws

    def capture_fi(self, block_size: int) -> None:
        """CUDA graphs of FlashInfer's call for every FiWorkspace made so far (gdn_graphs.ops.
        fi_prefill.fi_capture: one per prefill-row count and checkpoint interval on this block
        size), so that a prefill step issues it in one replay instead of FlashInfer's 0.2-0.35 ms
        of argument handling. Called by the builders (vLLM makes them after its profile run,
        which made the workspaces and compiled the kernels, and before its own graph capture);
        idempotent. Logged once per workspace."""
        for ws in self._workspaces.values():
            fw = getattr(ws, "fi", None)
            if fw is None or (block_size, id(fw)) in self.warmed_up:
                continue
            t0 = time.perf_counter()
            n = fi_capture(fw, block_size)
            self.warmed_up.add((block_size, id(fw)))
            _log.info("gdn_graphs: %d CUDA graphs of FlashInfer's prefill call (up to %d rows, "
                      "block %d) in %.2f s", n, fw.max_seqs, block_size, time.perf_counter() - t0)


class StepBuilder:
    """One KV-cache group's step builder: token counts (host) and block table (device) -> GDNStep
    over the group's persistent slot buffers."""

    def __init__(self, resources: GDNResources, block_size: int, table_width: int,
                 null_block: int, device: torch.device):
        self.planner = resources.planner(block_size, table_width, null_block, device)
        self.slots = self.planner.new_slots()
        resources.capture_fi(block_size)
        self.max_spec_len = resources.max_spec_len

    def build(self, query_start_loc: np.ndarray, seq_lens: np.ndarray, block_table: torch.Tensor,
              num_reqs: int, drafts: np.ndarray | None = None,
              device_seq_lens: torch.Tensor | None = None) -> GDNStep:
        """query_start_loc [rows + 1] and seq_lens [>= rows] on the host (tokens computed before
        the step = seq_lens - scheduled), the group's block table on the device; a pure decode
        step is padded to ``num_reqs`` decode rows (the CUDA-graph bucket). With speculative
        decoding the leading rows of at most 1 + k tokens are spec rows (vLLM sorts every row of
        up to 1 + k tokens first: its reorder_batch_threshold), so a verifying row, a decode
        without drafts and a prefill chunk that short all store the state after each token in
        the lookahead layout; a step of such rows alone, of one length, is padded to
        ``num_reqs`` rows. drafts: vLLM's ``num_decode_draft_tokens_cpu`` where it passes it (the
        drafts each row verifies, -1 for none): a row with drafts outside the spec rows (which
        would lose the states after its drafts) raises ValueError. device_seq_lens: int32
        [>= rows] on the device, the true ``seq_lens`` where the host's are optimistic (vLLM's
        async scheduling with speculation: a row whose previous step had drafts counts them all
        accepted on the host): the spec rows' slots are placed from it on the device
        (``gdn_graphs.vllm.spec_placement``); every other row must be exact on the host, which
        it is there (only a row of at most 1 + k tokens follows a step with drafts)."""
        rows = len(query_start_loc) - 1
        q = query_start_loc[1:] - query_start_loc[:-1]
        n = seq_lens[:rows] - q
        spec_rows = self.spec_rows(q)
        if drafts is not None:
            late = np.flatnonzero(np.asarray(drafts[:rows]) > 0)
            late = late[late >= spec_rows]
            if len(late):
                raise ValueError(f"gdn_graphs: row {int(late[0])} verifies drafts but comes after "
                                 f"a row of more than 1 + k = {self.max_spec_len} tokens; the "
                                 f"builder needs every verifying row first (vLLM's reorder with "
                                 f"reorder_batch_threshold >= 1 + k)")
        return self.planner.plan(query_start_loc, n, block_table, pad_decodes_to=num_reqs,
                                 slots=self.slots, spec_rows=spec_rows,
                                 device_seq_lens=device_seq_lens)

    def spec_rows(self, q: np.ndarray) -> int:
        """The leading rows of 1 .. max_spec_len tokens (0 without speculative decoding)."""
        if not self.max_spec_len:
            return 0
        longer = np.flatnonzero((q > self.max_spec_len) | (q == 0))
        return int(longer[0]) if len(longer) else len(q)

    def build_for_capture(self, query_start_loc, seq_lens, block_table, num_reqs) -> GDNStep:
        """A step for capturing a graph on the engine's dummy batch: every decode row reads and
        writes nothing (the dummy table's blocks belong to no request)."""
        step = self.build(query_start_loc, seq_lens, block_table, num_reqs)
        self.slots.clear_decode_slots()
        return step
