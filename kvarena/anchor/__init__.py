"""Conformance with the anchor engine (docs/design.md §9b).

The anchor's own allocator classes (sglang 0.5.23's ``UnifiedKVPool``,
``MultiEndedAllocator``, ``FloatMultiEndedAllocator``) run on CPU over a
fake KV cache and are driven with kvarena's calls:

- ``loader``: imports them without sglang's dependency tree;
- ``fake_cache``: records which virtual id's data sits at each physical slot;
- ``adapter``: ``AnchorArena``, kvarena's page-level API over the anchor;
- ``walk``, ``observe``, ``classify``, ``campaign``: the differential
  campaign behind ``kvarena conform`` and its classified differences;
- ``target``: the anchor as a ``kvarena vectors replay --target anchor`` client;
- ``cli``: the ``conform`` subcommand.

Importing this package registers the ``anchor`` vectors target; sglang is
imported only when an anchor arena is built.

May import: ``kvarena.spec``, ``kvarena.verification`` (the vectors' target registry).
"""


def _register():
    from kvarena.verification import vectors

    def factory(device="cpu"):
        from .target import AnchorTarget

        return AnchorTarget(device)

    vectors.register_target("anchor", factory)


_register()
