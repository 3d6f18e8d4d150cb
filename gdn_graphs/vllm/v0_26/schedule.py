"""vLLM 0.26: prefill chunks that end on a multiple of 64 tokens, so warm == cold holds in vLLM.

Our chunk kernels cut tokens at absolute multiples of CHUNK (64). A prefill step that ends
inside such a chunk splits that chunk's arithmetic in two, so the state it leaves, and every
block state after it, is then close to a cold run's but not equal (README "Conventions"). vLLM's
scheduler clips prefill chunks to block boundaries only in mode "align"
(``Scheduler._mamba_block_aligned_split``, switched on by ``need_mamba_block_aligned_split``);
in mode "all" a chunk ends wherever the step's token budget runs out (e.g. after the decodes of
the step took their share). With the plugin on, a scheduler in mode "all" clips each prefill
chunk's end down to a multiple of 64 until the request's known tokens end: at most 63 tokens of
a step's budget go to the next request instead, where "align" gives up to a block.
"""

from __future__ import annotations

import functools

from vllm.v1.core.sched.scheduler import Scheduler

from gdn_graphs.constants import CHUNK
from gdn_graphs.vllm import enabled

__all__ = ["chunk_aligned_split", "install"]


def chunk_aligned_split(request, num_new_tokens: int, num_new_local_computed_tokens: int = 0,
                        num_external_computed_tokens: int = 0) -> int:
    """The tokens to schedule for ``request`` so that its chunk ends on a multiple of CHUNK (or
    at the end of its known tokens); 0 when the budget does not reach the next multiple (the
    scheduler then skips the request for this step). Decodes are left as they are."""
    start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
    known = max(request.num_prompt_tokens, request.num_tokens - 1)  # a resumed request replays
    end = start + num_new_tokens
    if start >= known or end >= known:
        return num_new_tokens
    return max(end // CHUNK * CHUNK - start, 0)


def install() -> None:
    """Wrap ``Scheduler.__init__`` (AsyncScheduler's too: a subclass): an engine with the plugin
    on in mode "all" gets ``chunk_aligned_split`` as its split (idempotent)."""
    init = Scheduler.__init__
    if getattr(init, "_gdn_graphs", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if (self.has_mamba_layers and self.cache_config.mamba_cache_mode == "all"
                and enabled(self.vllm_config)):
            self.need_mamba_block_aligned_split = True
            self._mamba_block_aligned_split = chunk_aligned_split

    __init__._gdn_graphs = True
    Scheduler.__init__ = __init__
