"""The reusable runtime: host planning into persistent buffers, the GDN core every engine calls,
and CUDA-graph capture/replay. Engines (the embedded one, the vLLM plugin) build on these."""
