"""Which of SGLang's allocator members are kvarena's, which stay SGLang's,
and which are unsupported; and how an unsupported one raises.

Every member of SGLang's classes falls in one of three sets, which
``tests/sglang/test_surface.py`` checks against SGLang's own classes:

- **kvarena's**: defined by the drop-in (``dropin.py`` and its mixins,
  ``allocators.py``), on the composite.
- **SGLang's scheduling policy** (``INHERITED``): pure functions of the views
  and gates the drop-in defines (``reclaim_plan``, ``can_reserve``, the
  prefill budget, ...), inherited as they are, so SGLang decides how much to
  evict and kvarena what fits.
- **Unsupported** (``UNSUPPORTED``): decode context parallelism,
  post-capture backing, and SGLang's
  own sub-allocator machinery that the composite replaces; each raises
  ``NotImplementedError`` naming the feature.
"""

# SGLang's members that stay SGLang's: scheduling policy over the drop-in's views and gates.
INHERITED = frozenset(
    {
        "reclaim_plan",
        "can_reserve",
        "prealloc_fits",
        "prealloc_fits_assumes_reclaim",
        "prealloc_ceiling_fits",
        "reclaim_for_prealloc",
        "create_prefill_budget",
        "max_new_tokens_for_memory",
        "swa_capacity_and_available",
        "get_extend_allocation_demand",
        "evict_to_free_tokens",
        "request_slot_reserve",
        "current_full_capacity",
        "current_swa_capacity",
        "size",
        "size_full",
        "size_swa",
        "get_kvcache",
        "mamba_full_cache_donor",
        "flush_deferred_full_frees",
        "full_tokens_before_mamba_recheck",
        "merge_and_sort_free",
        "_copy_for_free_group",
        "check_decode_capacity",
        "free_segments",
        "free_full_segments",
        "_page_disjoint",
        "free_full",  # the mamba stack's: a plain free (no SWA peer)
        "get_all_free_pages",
        "new_pages_available",
        "swa_req_ring",
        "_token_id_capacity",  # the tri-pool's eviction gates, over the views' id and byte counts
        "_token_allocation_byte_shortfall",
    }
)

# SGLang's members kvarena does not support, and the feature each belongs to.
UNSUPPORTED = {
    "resize": "post-capture KV backing",
    "swa_ring_cost_tokens": "the per-request SWA ring",
}
_INTERNAL = "SGLang's own sub-allocators (kvarena's composite replaces them)"
_STATIC_SWA = "SGLang's static SWA allocator (full_to_swa_index_mapping)"
UNSUPPORTED |= dict.fromkeys(
    (
        "_build_swa_attn_allocator",
        "_wire_peers",
        "_flush_targets",
        "_ask_float_for_room",
        "_alloc_demand",
        "_extend_in_virtual_space",
        "_free_swa_page_reps",
        "_release_page_reps",
        "_joint_capacity_memo_violations",
        "_token_end_frontiers",
        "_token_end_reclaim_satisfied",
        "_token_float_high_target",
    ),
    _INTERNAL,
)
UNSUPPORTED |= dict.fromkeys(
    ("_expand_to_full_pages", "_free_swa_pages", "_free_swa_pages_cuda", "_free_swa_pages_none_cuda", "_release_swa"),
    _STATIC_SWA,
)


def _unsupported(feature: str):
    raise NotImplementedError(
        f"kvarena.sglang: {feature} is not supported by kvarena's allocator "
        "(docs/guides/integrating.md, 'SGLang on kvarena')"
    )


def _raiser(name: str, feature: str):
    def method(self, *args, **kwargs):
        _unsupported(f"{feature}: {name}")

    method.__name__ = name
    method.__doc__ = f"Unsupported: {feature} (raises ``NotImplementedError``)."
    return method


def _unsupported_property(name: str, feature: str):
    def get(self):
        _unsupported(f"{feature}: {name}")

    return property(get, doc=f"Unsupported: {feature}.")


def _install_unsupported(cls, names):
    for name in names:
        feature = UNSUPPORTED[name]
        if isinstance(getattr(cls, name), property):
            setattr(cls, name, _unsupported_property(name, feature))
        else:
            setattr(cls, name, _raiser(name, feature))
    return cls
