"""Model geometries for the serving simulator (docs/anchor.md §4).

Bytes per token are ``layers x 2 x kv_heads x head_dim x 2`` (bf16) summed
over a kind's layers; state per request is conv (bf16) plus SSM (fp32) over
the state layers.  The figures and their sources are in docs/anchor.md §4 and
docs/results/simulator.md.

The simulator is **page-granular**: one simulated unit is one KV page of
``page_tokens`` tokens (its full and SWA entries), and every byte count is
divided by ``byte_scale`` so that a budget of tens of GiB becomes a buffer
of a few MiB on the CPU.  Every figure here is a multiple of 4096, so with
the defaults (16 tokens a page, scale 4096) the scaled sizes are exact and
every ratio between kinds is the model's own.  ``Sizes`` refuses a scale
that would round.
"""

from dataclasses import dataclass, replace

GIB = 1 << 30


@dataclass(frozen=True)
class Preset:
    name: str
    full_bytes: int  # per token, all full-attention layers
    swa_bytes: int = 0  # per token, all sliding-window layers
    state_bytes: int = 0  # per request, all state layers
    window: int = 0  # the engine's window: the model's sliding_window - 1
    note: str = ""
    synthetic: bool = False
    layers: tuple = ()  # (full, swa, state) layer counts: the per-layer sizes a padded pool needs
    ssm_bytes: int = 0  # of state_bytes, the SSM (temporal) state's, kept in fp32 (SGLang's mamba_ssm_dtype)
    context_len: int = 0  # the model's max_position_embeddings: SGLang's running limit reads it
    state_kind: str = ""  # "gdn" (gated delta net) or "mamba2": the state layers' kernel family
    mamba_chunk_tokens: int = 0  # the state kernel's chunk: SGLang's checkpoint grid (mamba_cache_chunk_size)

    def with_ssm_dtype_bytes(self, n):
        """This model with its SSM state kept at ``n`` bytes an element (4:
        as is, fp32; 2: bf16, vLLM's default for these models)."""
        if n not in (2, 4):
            raise ValueError(f"preset {self.name!r}: an SSM state element is 2 or 4 bytes, got {n}")
        return replace(
            self, state_bytes=self.state_bytes - self.ssm_bytes * (4 - n) // 4, ssm_bytes=self.ssm_bytes * n // 4
        )

    def at_full_length(self):
        """This model with its sliding-window layers kept at full length, as
        an engine without hybrid SWA memory keeps them (SGLang on Gemma 2
        and 3: ``engines.Engine.runs_hybrid``)."""
        if not self.swa_bytes:
            return self
        full, swa, state = self.layers or (0, 0, 0)
        return replace(
            self, full_bytes=self.full_bytes + self.swa_bytes, swa_bytes=0, window=0, layers=(full + swa, 0, state)
        )

    @property
    def kinds(self):
        """Which kinds of state the model keeps: a subset of full, swa, state."""
        return ("full",) + (("swa",) if self.swa_bytes else ()) + (("state",) if self.state_bytes else ())

    @property
    def composite(self):
        """The kvarena composite that serves this model."""
        return {("full", "swa"): "HybridSWA", ("full", "state"): "MambaHybrid", ("full", "swa", "state"): "TriPool"}[
            self.kinds
        ]


PRESETS = {
    p.name: p
    for p in (
        Preset(
            "gpt-oss-120b",
            36_864,
            swa_bytes=36_864,
            window=127,
            note="18 full / 18 SWA layers, 8 kv heads x 64, window 128",
            layers=(18, 18, 0),
            context_len=131_072,
        ),
        Preset(
            "gemma-3-27b",
            81_920,
            swa_bytes=425_984,
            window=1023,
            note="10 full / 52 SWA layers, 16 kv heads x 128, window 1024",
            layers=(10, 52, 0),
            context_len=131_072,
        ),
        Preset(
            "qwen3-next-80b-a3b",
            24_576,
            state_bytes=77_266_944,
            note="12 full layers (2 kv heads x 256), 36 gated-delta state layers",
            layers=(12, 0, 36),
            ssm_bytes=36 * 32 * 128 * 128 * 4,  # a layer: 32 value heads x 128 x 128, fp32 (conv: 49,152 bf16)
            context_len=262_144,
            state_kind="gdn",
            mamba_chunk_tokens=64,  # no mamba_chunk_size in its config: FLA's CHUNK_SIZE
        ),
        Preset(
            "nemotron-h-8b",
            16_384,
            state_bytes=102_137_856,
            note="4 full layers (8 kv heads x 128), 24 mamba2 state layers",
            layers=(4, 0, 24),
            ssm_bytes=24 * 128 * 64 * 128 * 4,  # a layer: 128 heads x 64 x 128 state, fp32 (conv: 61,440 bf16)
            context_len=8_192,
            state_kind="mamba2",
            mamba_chunk_tokens=256,  # its config's chunk_size
        ),
        Preset(
            "tri-synthetic",
            24_576,
            swa_bytes=24_576,
            state_bytes=102_137_856,
            window=127,
            synthetic=True,
            note="SYNTHETIC: gpt-oss-20b's attention (12 full / 12 SWA layers, window 128) with "
            "Nemotron-H-8B's mamba2 state; no public model has all three kinds",
            layers=(12, 12, 24),
            ssm_bytes=24 * 128 * 64 * 128 * 4,  # Nemotron-H-8B's
            context_len=131_072,  # gpt-oss-20b's
            state_kind="mamba2",
            mamba_chunk_tokens=256,  # Nemotron-H-8B's
        ),
    )
}


def preset(name):
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None


@dataclass(frozen=True)
class Sizes:
    """A preset's scaled byte sizes for one simulated budget.

    ``unit_full``/``unit_swa``: bytes of one simulated unit (a page of
    ``page_tokens`` tokens) in full / SWA KV; ``slot``: one state slot;
    ``total``: the buffer, all after dividing by ``byte_scale``."""

    preset: Preset
    budget_bytes: int
    page_tokens: int
    byte_scale: int
    unit_full: int
    unit_swa: int
    slot: int
    total: int

    @classmethod
    def of(cls, p, budget_gib=40.0, page_tokens=16, byte_scale=4096, budget_bytes=None):
        """``p`` on a budget of ``budget_gib`` GiB (or exactly ``budget_bytes``)."""
        if page_tokens < 1 or byte_scale < 1:
            raise ValueError(f"preset {p.name!r}: page_tokens and byte_scale must be >= 1")
        budget = int(budget_gib * GIB) if budget_bytes is None else int(budget_bytes)

        def scaled(what, v):
            if v % byte_scale:
                raise ValueError(
                    f"preset {p.name!r}: {what} {v} bytes is not a multiple of byte_scale "
                    f"{byte_scale}; the scaled sizes would round"
                )
            return v // byte_scale

        return cls(
            p,
            budget,
            page_tokens,
            byte_scale,
            scaled("full bytes per page", p.full_bytes * page_tokens),
            scaled("swa bytes per page", p.swa_bytes * page_tokens),
            scaled("state bytes per slot", p.state_bytes),
            budget // byte_scale,
        )

    def units(self, tokens):
        """Whole pages holding ``tokens`` tokens (a length rounds up to a page)."""
        return -(-tokens // self.page_tokens)

    @property
    def window_units(self):
        """Pages a request keeps in SWA after a window free (the anchor's rule)."""
        if not self.preset.window:
            return 0
        return self.units(self.preset.window + self.page_tokens)

    def build(self, policy="anchor", lazy=True, device="cpu"):
        """The unified arena: the preset's composite over the whole buffer,
        one unit a page (``page_size=1``)."""
        from kvarena import impl

        kind = self.preset.composite
        if kind == "HybridSWA":
            return impl.HybridSWA(self.total, self.unit_full, self.unit_swa, 1, lazy=lazy, policy=policy, device=device)
        if kind == "MambaHybrid":
            return impl.MambaHybrid(self.total, self.unit_full, self.slot, 1, lazy=lazy, policy=policy, device=device)
        return impl.TriPool(
            self.total, self.unit_full, self.unit_swa, self.slot, 1, lazy=lazy, policy=policy, device=device
        )


# docs/anchor.md §2: the static engine's sizing defaults.
DEFAULT_SWA_RATIO = 0.8  # swa_full_tokens_ratio: SWA tokens per full token
DEFAULT_MAMBA_RATIO = 0.9  # mamba_full_memory_ratio: state memory per KV memory


@dataclass(frozen=True)
class Split:
    """A static split: pages (units) per KV pool and state slots, fixed at boot."""

    swa_ratio: float
    mamba_ratio: float
    full_units: int
    swa_units: int
    slots: int

    def walls(self, s):
        """Byte offsets of the walls, low to high, in the unified chain's
        order (state, swa, full from byte 0), as fractions of the buffer."""
        state = self.slots * s.slot
        swa = self.swa_units * s.unit_swa
        out = []
        if "state" in s.preset.kinds:
            out.append(state / s.total)
        if "swa" in s.preset.kinds:
            out.append((state + swa) / s.total)
        return out


def static_split(s, swa_ratio=DEFAULT_SWA_RATIO, mamba_ratio=DEFAULT_MAMBA_RATIO):
    """The anchor's static sizing (docs/anchor.md §2) of buffer ``s.total``.

    State gets ``mamba_ratio / (1 + mamba_ratio)`` of the memory (whole
    slots); the KV rest ``M`` gives ``full = M / (e_full + swa_ratio *
    e_swa)`` pages and ``swa = swa_ratio * full``, both rounded down."""
    kinds = s.preset.kinds
    if "swa" in kinds and not 0 < swa_ratio:
        raise ValueError(f"preset {s.preset.name!r}: swa_ratio must be > 0, got {swa_ratio}")
    if "state" in kinds and not 0 < mamba_ratio:
        raise ValueError(f"preset {s.preset.name!r}: mamba_ratio must be > 0, got {mamba_ratio}")
    slots = int(s.total * mamba_ratio / (1 + mamba_ratio)) // s.slot if "state" in kinds else 0
    kv = s.total - slots * s.slot
    if "swa" in kinds:
        full = int(kv / (s.unit_full + swa_ratio * s.unit_swa))
        swa = int(swa_ratio * full)
    else:
        full, swa = kv // s.unit_full, 0
    return Split(swa_ratio if "swa" in kinds else 0.0, mamba_ratio if "state" in kinds else 0.0, full, swa, slots)
