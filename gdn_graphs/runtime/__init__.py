"""The reusable runtime: the step (block arithmetic, row kinds, ``GDNStep``), host planning into
persistent buffers, the GDN core every engine calls, and CUDA-graph capture/replay. Engines (the
embedded one, the vLLM plugin) build on these."""

from gdn_graphs.runtime.core import (GDNPools, GDNWeights, StepContext, gdn_core, get_step_context,
                                     run_gdn_core, step_context)
from gdn_graphs.runtime.graphs import GraphManager
from gdn_graphs.runtime.plan import GDNPlanner, PlanLimits
from gdn_graphs.runtime.step import GDNStep, StepPlan, classify_rows, count_decode_rows

__all__ = ["GDNPools", "GDNWeights", "StepContext", "gdn_core", "get_step_context", "run_gdn_core",
           "step_context", "GraphManager", "GDNPlanner", "PlanLimits", "GDNStep", "StepPlan",
           "count_decode_rows", "classify_rows"]
