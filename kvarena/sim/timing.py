"""The simulator's clock: a roofline of the model on a named accelerator.

A decode iteration reads the weights it touches and every running request's
KV and state, and does two FLOPs per active parameter per token; it takes
whichever is longer, bytes over memory bandwidth or FLOPs over peak
(``iteration_seconds``).  A simulated step is ``page_tokens`` iterations
with the step's prefill tokens spread over them.  On top of that, a step
pays for the bytes its relocations moved (read and written once each, at
``COPY_EFFICIENCY`` of the memory bandwidth, the copy target of the hot
path) and, when measured, for the allocator's own CPU time.  No overlap is
assumed between the allocator and the forward pass, which charges the
allocator in full.

What this leaves out, on purpose, the same for every setup: attention
FLOPs (decode is bound by bytes; a prefill chunk's attention grows with its
prefix), kernel launch and communication costs, and any efficiency below
the roofline (real engines reach well under peak).  So the times are lower
bounds, and the comparisons between setups, not the absolute figures, are
what the simulator is for.

Sources: H200 SXM, NVIDIA's H200 datasheet (141 GB HBM3e at 4.8 TB/s; BF16
Tensor Core 989 TFLOPS dense, the datasheet's 1,979 being with sparsity).
Model parameters are the models' public model cards (``MODELS``).
"""

from dataclasses import dataclass

GB = 10**9


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bandwidth: float  # bytes/s
    peak_flops: float  # dense BF16 FLOP/s
    memory: float  # bytes
    source: str


ACCELERATORS = {
    "h200": Accelerator(
        "h200", 4.8e12, 989e12, 141 * GB, "NVIDIA H200 datasheet (SXM): 4.8 TB/s, 989 TFLOPS BF16 dense"
    ),
    "h100": Accelerator(
        "h100", 3.35e12, 989e12, 80 * GB, "NVIDIA H100 datasheet (SXM): 3.35 TB/s, 989 TFLOPS BF16 dense"
    ),
}
COPY_EFFICIENCY = 0.8  # a relocation copies at this share of the memory bandwidth (issue 23's CUDA target)


@dataclass(frozen=True)
class Model:
    """What a forward pass reads and computes: parameters (total, and active
    per token for a mixture of experts) and the weights' bytes as served."""

    params_total: float
    params_active: float
    weight_bytes: float  # the checkpoint as served (gpt-oss: MXFP4 experts)
    gpus: int  # tensor-parallel group that holds the weights and the KV budget
    source: str

    @property
    def active_weight_bytes(self):
        """Weight bytes one token reads: the active share of the checkpoint."""
        return self.weight_bytes * self.params_active / self.params_total


MODELS = {
    "gpt-oss-120b": Model(116.8e9, 5.1e9, 65.3 * GB, 1, "OpenAI gpt-oss model card: 116.8B total, 5.1B active, MXFP4"),
    "gemma-3-27b": Model(27.4e9, 27.4e9, 54.8 * GB, 1, "Google Gemma 3 model card: 27B dense, BF16"),
    "qwen3-next-80b-a3b": Model(80e9, 3e9, 160 * GB, 2, "Qwen3-Next-80B-A3B model card: 80B total, 3B active, BF16"),
    "nemotron-h-8b": Model(8e9, 8e9, 16 * GB, 1, "NVIDIA Nemotron-H-8B model card: 8B dense, BF16"),
    "tri-synthetic": Model(
        20.9e9, 3.6e9, 13.8 * GB, 1, "SYNTHETIC: gpt-oss-20b's weights (model card: 20.9B total, 3.6B active, MXFP4)"
    ),
}


@dataclass(frozen=True)
class Clock:
    """A preset's roofline on ``gpus`` accelerators (bandwidth and FLOPs add up
    across the tensor-parallel group)."""

    accel: Accelerator
    model: Model
    page_tokens: int

    @property
    def bandwidth(self):
        return self.accel.memory_bandwidth * self.model.gpus

    @property
    def flops(self):
        return self.accel.peak_flops * self.model.gpus

    def iteration_seconds(self, tokens, kv_bytes):
        """One forward pass over ``tokens`` tokens (decode and prefill alike)
        that reads ``kv_bytes`` of KV and state.  A mixture of experts reads
        at most its whole checkpoint, at least the active share per token."""
        if tokens <= 0:
            return 0.0
        m = self.model
        weights = min(m.weight_bytes, m.active_weight_bytes * tokens)
        return max((weights + kv_bytes) / self.bandwidth, 2 * m.params_active * tokens / self.flops)

    def step_seconds(self, decode_tokens, prefill_tokens, kv_bytes):
        """``page_tokens`` iterations: each decodes ``decode_tokens`` (one per
        decoding request) and takes its share of the step's prefill."""
        pt = self.page_tokens
        return pt * self.iteration_seconds(decode_tokens + prefill_tokens / pt, kv_bytes)

    def copy_seconds(self, moved_bytes):
        """Relocating ``moved_bytes``: each read and written once."""
        return 2 * moved_bytes / (COPY_EFFICIENCY * self.bandwidth)


def clock(preset_name, accel="h200", page_tokens=16):
    try:
        a = ACCELERATORS[accel]
    except KeyError:
        raise ValueError(f"unknown accelerator {accel!r}; accelerators: {', '.join(ACCELERATORS)}") from None
    try:
        m = MODELS[preset_name]
    except KeyError:
        raise ValueError(f"preset {preset_name!r} has no model parameters for the time model") from None
    return Clock(a, m, page_tokens)
