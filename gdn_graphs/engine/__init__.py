"""The embedded engine: a small hybrid GDN model, a scheduler with prefix caching at every block
boundary, and the ``gdn-graphs`` command line. It uses the runtime as any other engine would."""

from gdn_graphs.engine.engine import MODES, Engine, EngineConfig, Request, mode_available
from gdn_graphs.engine.model import HybridGDNModel, ModelConfig, preset

__all__ = ["MODES", "Engine", "EngineConfig", "Request", "mode_available", "HybridGDNModel",
           "ModelConfig", "preset"]
