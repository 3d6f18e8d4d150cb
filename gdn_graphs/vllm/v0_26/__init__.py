"""vLLM 0.26 adapter."""
