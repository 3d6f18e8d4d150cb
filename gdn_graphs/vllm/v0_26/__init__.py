"""The vLLM 0.26 adapter: everything that depends on vLLM 0.26's internals, and only that.

Modules: ``config`` (registration and the config hook, imported in every vLLM process), ``model``
(model classes, GDN layer, backend, metadata builder; imported where vLLM builds the model),
``qwen3_5`` (Qwen3.5's classes; vLLM's Qwen3.5 imports torchvision), ``pages`` (the page layout),
``state_pages`` (the GDN groups' KV-cache spec and manager: capacity, page rules, page stats),
``spec_pages`` (their pages with speculative decoding: the lookahead layout), ``qwen3_5_mtp``
(Qwen3.5's MTP draft classes), ``schedule`` (prefill chunks ending on multiples of 64).
The version-neutral parts are ``gdn_graphs.vllm.slots``, ``.builder``, ``.warmup`` and
``gdn_graphs.runtime``.

What it patches in vLLM (each undone by ``additional_config={"gdn_graphs": False}`` per engine):
* ``ModelRegistry.register_model`` for Qwen3NextForCausalLM, Qwen3_5ForConditionalGeneration and
  Qwen3_5MoeForConditionalGeneration: our subclasses (``all_mode_model``), which declare
  ``supports_mamba_prefix_caching`` and show vLLM's ``__init__`` ``mamba_cache_mode`` "align"
  while it builds (vLLM's classes refuse "all" there; nothing else in them reads the mode).
* ``ModelRegistry.register_model`` for the MTP draft models Qwen3NextMTP, Qwen3_5MTP and
  Qwen3_5MoeMTP: subclasses (``all_mode_draft``) that show ``__init__`` mode "align" (vLLM's
  refuse "all" there; they have no GDN layers).
* ``MODELS_CONFIG_MAP`` entries for the same architectures: ``GDNAllConfig``, which runs vLLM's
  own entry first, then sets ``cache_config.mamba_cache_mode`` ("all" with prefix caching),
  ``mamba_block_size`` and ``user_specified_mamba_block_size``; it refuses
  another cache mode, a block size not a multiple of 64 and any ``prefix_match_unit``. With
  ``speculative_config`` (``check_speculative``): accepts method "ngram", "ngram_gpu", "eagle3" and
  the MTP methods (async scheduling as vLLM sets it), refuses
  ``parallel_drafting``, prefix caching off and k outside [1, 63]; reads ``method``,
  ``num_speculative_tokens``; the builder reads ``scheduler_config.async_scheduling`` and then
  ``CommonAttentionMetadata.seq_lens`` (device; true where the host's are optimistic).
* The custom-op out-of-tree registry: ``QwenGatedDeltaNetAttention.register_oot`` with our layer,
  after popping the private ``op_registry_oot`` entry (idempotent re-registration).
* ``KVCacheSpecRegistry``: registers ``GDNStateSpec`` (a ``MambaSpec`` subclass, uniform base
  ``MambaSpec``) with ``GDNStateManager`` (a ``MambaManager`` subclass), after the private
  ``_ensure_registered()`` (the registry fills itself with vLLM's specs only while empty). Only
  our layer makes that spec, in mode "all" with our kernels on; every other spec keeps vLLM's
  manager.
* ``kv_cache_utils._max_memory_usage_bytes_from_groups`` (vLLM's one-request count for its
  start-up check and max_model_len auto-fit) is wrapped: where a group's spec is ours, it also
  counts the pool's null block, so that a request of max_model_len passes vLLM's full-sequence
  admission gate in a pool the check accepted (``state_pages._count_the_null_block``).
* ``Scheduler.__init__`` (``AsyncScheduler``'s too) is wrapped: an engine with the plugin on in
  mode "all" sets ``need_mamba_block_aligned_split`` (vLLM sets it in "align" only) and an
  instance ``_mamba_block_aligned_split`` that clips prefill chunk ends to multiples of 64;
  reads ``has_mamba_layers``, ``cache_config``, ``vllm_config``, and ``Request``'s
  ``num_computed_tokens``, ``num_prompt_tokens``, ``num_tokens``.

What it reads or overrides:
* ``QwenGatedDeltaNetAttention.get_kv_cache_spec`` (ours returns ``GDNStateSpec`` in mode "all").
* ``MambaSpec.max_memory_usage_bytes`` (one page per request: what ``get_kv_cache_capacity``,
  the "GPU KV cache size" log and the start-up check ``_check_enough_kv_cache_memory`` /
  ``_max_memory_usage_bytes_from_groups`` count) and ``max_num_blocks_per_req`` (kept at
  ``cdiv(max_len, block_size)``: the worker's block-table row); ``vllm_config.max_in_flight_tokens``.
* ``MambaManager`` in mode "all": overrides ``get_num_blocks_to_allocate``,
  ``allocate_new_blocks``, ``add_local_computed_blocks``, ``remove_skipped_blocks``,
  ``pop_blocks_for_free``, ``new_step_starts`` and ``cache_blocks``, which first gives
  ``Request.shared_prefix_boundary`` a page by writing it into the list ``allocate_new_blocks``
  returned this step (``KVCacheManager.allocate_slots`` makes that list the step's block ids
  after calling ``cache_blocks``). Reads ``req_to_blocks``, ``block_size``,
  ``kv_cache_group_id``, ``cached_blocks_this_step``, ``_null_block``,
  ``_get_num_evictable_blocks``; ``BlockPool.get_num_free_blocks``, ``get_new_blocks``,
  ``free_blocks``, ``num_gpu_blocks``, the private
  ``_maybe_evict_cached_block`` (a page whose state is rewritten in place leaves the prefix
  cache) and ``cached_block_hash_to_block._cache`` (the evictable-page count);
  ``KVCacheBlock.ref_cnt``, ``is_null``, ``block_hash``; the key layout of
  ``kv_cache_utils.make_block_hash_with_group_id`` (group id in the last 4 bytes);
  ``Request.request_id``; ``vllm_config.kv_transfer_config`` (no junction pages with a KV
  connector). ``find_longest_cache_hit`` stays vLLM's (right-to-left scan: block-by-block
  fallback).
* ``additional_config["gdn_graphs"]`` as a dict keeps the plugin on and carries its options
  (``keep_states``, ``stats_every``, ``stats_interval_s``).
* ``QwenGatedDeltaNetAttention``: overrides ``_forward_core`` and ``get_attn_backend``; reads
  ``conv1d``, ``A_log``, ``dt_bias``, ``kv_cache``, ``prefix``, ``tp_size``, ``num_k_heads``,
  ``num_v_heads``, ``head_k_dim``, ``head_v_dim``, ``activation``, ``get_state_dtype()``;
  ``mamba_utils.is_conv_state_dim_first()``.
* ``GDNAttentionBackend`` (subclassed for ``get_builder_cls``), ``AttentionMetadataBuilder``
  (``_init_reorder_batch_threshold``, with speculation: rows of up to 1 + k tokens first;
  ``get_cudagraph_support``: ``UNIFORM_BATCH`` with speculation, else
  ``UNIFORM_SINGLE_TOKEN_DECODE``). With speculation, ``GDNSpecStateSpec`` (``num_speculative_blocks``
  = k + 1) and ``GDNSpecStateManager`` are registered like the plain pair; ``MambaSpec``'s
  ``max_num_blocks_per_req`` then gives the block table k + 1 more columns.
* ``CommonAttentionMetadata``: ``query_start_loc_cpu``, the private ``_seq_lens_cpu`` (else
  ``seq_lens_cpu_upper_bound``), ``block_table_tensor``, ``num_reqs``, ``num_actual_tokens``;
  ``NULL_BLOCK_ID``.
* ``MambaSpec.block_size`` and ``max_num_blocks_per_req`` (the block table's row length);
  ``cache_config.mamba_page_size_padded`` and the page layout of a GDN layer's Mamba state.
* ``get_forward_context().attn_metadata`` (None during the profile run: the warm-up),
  ``compilation_config.static_forward_context`` (the builders find the layers' shared
  ``GDNResources``), ``compilation_config.max_cudagraph_capture_size``,
  ``scheduler_config.max_num_seqs`` and ``max_num_batched_tokens``,
  ``observability_config.enable_layerwise_nvtx_tracing`` (switches our NVTX ranges on).
"""

__all__ = ["register"]


def register() -> None:
    """The plugin's registration for vLLM 0.26 (imports vLLM: only where vLLM runs)."""
    from gdn_graphs.vllm.v0_26.config import register as register_0_26

    register_0_26()
