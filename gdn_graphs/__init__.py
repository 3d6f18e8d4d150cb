"""gdn_graphs: prefix caching at every block boundary for GatedDeltaNet layers,
graph-safe under FULL CUDA-graph decode and piecewise torch.compile prefill."""

from gdn_graphs.constants import CHUNK, NO_SLOT

__all__ = ["CHUNK", "NO_SLOT"]
__version__ = "0.1.0"
