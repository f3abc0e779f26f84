"""The simulator's clock: a roofline of the model on a named accelerator.

A decode iteration reads the weights it touches and every running request's
KV and state, and does two FLOPs per active parameter per token; it takes
whichever is longer, bytes over memory bandwidth or FLOPs over peak
(``iteration_seconds``).  A mixture of experts reads its dense weights and
the experts its batch routes to: with ``E`` experts, ``k`` a token, and
routing taken as uniform, a batch of ``B`` tokens touches an expected
``1 - (1 - k/E)^B`` of each layer's experts (``Model.weights_read``).  A
simulated step is ``page_tokens`` decode iterations and the step's prefill,
cut into chunks of at most ``chunk_tokens``, run as the engine runs them
(``step_seconds``).  SGLang by default runs a prefill chunk as a forward
pass of its own, and the decoding requests wait for it
(``enable_mixed_chunk`` is False: ``srt/arg_groups/fields/schedule.py``;
``Scheduler.get_next_batch_to_run`` runs a prefill batch first when it can).
vLLM's scheduler, and SGLang with ``--enable-mixed-chunk``, put a chunk in
a decode iteration: one forward over both, whose token budget the decodes
share (``max_num_batched_tokens``; SGLang's ``mixed_with_decode_tokens``).
Each pass is charged on its own, so a prefill's FLOPs never hide under a
decode's bytes.  A batch larger than the engine's largest CUDA graph runs
eagerly and pays a launch for each of its kernels (``EAGER_LAUNCHES_PER_LAYER``
a layer, ``Accelerator.launch_seconds`` each): a decode batch above the
decode graphs, a prefill or mixed pass above the prefill graphs.
On top of that, a step pays for the bytes its relocations moved (read and
written once each, at ``COPY_EFFICIENCY`` of the memory bandwidth, the copy
target of the hot path) and for the allocator's own work (``alloc_seconds``):
by default its kernel launches as a GPU runs it, at ``launch_seconds`` each
(``--alloc-cost gpu``, ``kvarena.sim.launches``: each setup's calls at the
launches ``kvarena bench --only ops`` counts, the unified arena's on its
Triton path, its ladder's moves on torch, a static pool's as a torch free
list's); or the torch operations its CPU torch path dispatches, at the same
cost (``torch``); or its CPU time measured in this process (``cpu``).  No
overlap is assumed between the allocator and the forward pass, which
charges the allocator in full.

The KV budget is what the engine leaves for the KV cache
(``kv_budget_bytes``): the tensor-parallel group's memory times SGLang's
``mem_fraction_static``, less the weights.  ``mem_fraction_static`` is
SGLang 0.5.23's own default (``mem_fraction_static``): the device memory as
``nvidia-smi`` reports it, less a reserve for activations and CUDA graphs
(``srt/arg_groups/memory_hook.py``, ``handle_gpu_memory_settings`` and
``reserve_for_graph_mb``).  Every setup gets that one budget, vLLM's padded
pool included, so that a ratio between setups measures their layouts and
not two engines' memory reserves.

What this leaves out, on purpose, the same for every setup: attention
FLOPs and a prefill pass's KV reads (decode is bound by bytes; a prefill
chunk's attention grows with its prefix), communication costs, and any efficiency below the roofline (real
engines reach well under peak).  So the times are lower bounds, and the
comparisons between setups, not the absolute figures, are what the
simulator is for.

Sources: H200 SXM, NVIDIA's H200 datasheet (141 GB HBM3e at 4.8 TB/s; BF16
Tensor Core 989 TFLOPS dense, the datasheet's 1,979 being with sparsity);
its memory as ``nvidia-smi`` reports it, 143,771 MiB (H100 SXM: 81,559
MiB), which is what SGLang sizes from (``get_nvgpu_memory_capacity``).
Model parameters and expert counts are the models' public model cards and
configs (``MODELS``).  The launch cost is a stated assumption, not a
measurement (no GPU has timed it here): a few microseconds is what a CUDA
kernel launch through torch's eager dispatch costs on a current host.
"""

from dataclasses import dataclass

GB = 10**9
MIB = 1 << 20


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bandwidth: float  # bytes/s
    peak_flops: float  # dense BF16 FLOP/s
    memory: float  # bytes, as nvidia-smi reports them (what SGLang sizes from)
    source: str
    launch_seconds: float = 5e-6  # one kernel launch from the host (a stated assumption: see the module)


ACCELERATORS = {
    "h200": Accelerator(
        "h200", 4.8e12, 989e12, 143_771 * MIB, "NVIDIA H200 datasheet (SXM): 4.8 TB/s, 989 TFLOPS BF16 dense"
    ),
    "h100": Accelerator(
        "h100", 3.35e12, 989e12, 81_559 * MIB, "NVIDIA H100 datasheet (SXM): 3.35 TB/s, 989 TFLOPS BF16 dense"
    ),
}
COPY_EFFICIENCY = 0.8  # a relocation copies at this share of the memory bandwidth (issue 23's CUDA target)
# SGLang's sizing on an H100/H200-class device (memory_hook.py): chunked
# prefill of 8192 tokens, decode CUDA graphs up to batch 256 below TP 4, and
# 58 prefill graph sizes (cuda_graph_hook.py, generate_prefill_cuda_graph_batch_sizes).
SGLANG_CHUNKED_PREFILL = 8192
SGLANG_DECODE_GRAPH_BS = 256
SGLANG_PREFILL_GRAPH_SIZES = 58
EAGER_LAUNCHES_PER_LAYER = 12  # kernels a layer launches in an eager forward (norms, projections, attention, MoE)


@dataclass(frozen=True)
class Model:
    """What a forward pass reads and computes: parameters (total, and active
    per token for a mixture of experts) and the weights' bytes as served."""

    params_total: float
    params_active: float
    weight_bytes: float  # the checkpoint as served (gpt-oss: MXFP4 experts)
    gpus: int  # tensor-parallel group that holds the weights and the KV budget
    source: str
    experts: int = 0  # routed experts a MoE layer holds (0: a dense model)
    top_k: int = 0  # experts a token is routed to

    @property
    def active_weight_bytes(self):
        """Weight bytes one token reads: the active share of the checkpoint."""
        return self.weight_bytes * self.params_active / self.params_total

    @property
    def expert_params(self):
        """Parameters in routed experts: from ``total = dense + X`` and
        ``active = dense + X k / E``."""
        if not self.experts:
            return 0.0
        return (self.params_total - self.params_active) / (1 - self.top_k / self.experts)

    def coverage(self, tokens):
        """The expected share of a layer's experts ``tokens`` tokens touch,
        each routed to ``top_k`` of ``experts`` uniformly."""
        return 1 - (1 - self.top_k / self.experts) ** tokens

    def weights_read(self, tokens):
        """Weight bytes one iteration over ``tokens`` tokens reads: the dense
        weights, and the experts the batch is expected to touch."""
        if not self.experts:
            return self.weight_bytes
        x = self.expert_params
        return self.weight_bytes * (self.params_total - x + x * self.coverage(tokens)) / self.params_total


MODELS = {
    "gpt-oss-120b": Model(
        116.8e9,
        5.1e9,
        65.3 * GB,
        1,
        "OpenAI gpt-oss model card: 116.8B total, 5.1B active, MXFP4; 128 experts, top 4",
        experts=128,
        top_k=4,
    ),
    "gemma-3-27b": Model(27.4e9, 27.4e9, 54.8 * GB, 1, "Google Gemma 3 model card: 27B dense, BF16"),
    "qwen3-next-80b-a3b": Model(
        80e9,
        3e9,
        160 * GB,
        2,
        "Qwen3-Next-80B-A3B model card: 80B total, 3B active, BF16; 512 experts, top 10",
        experts=512,
        top_k=10,
    ),
    "nemotron-h-8b": Model(8e9, 8e9, 16 * GB, 1, "NVIDIA Nemotron-H-8B model card: 8B dense, BF16"),
    "tri-synthetic": Model(
        20.9e9,
        3.6e9,
        13.8 * GB,
        1,
        "SYNTHETIC: gpt-oss-20b's weights (model card: 20.9B total, 3.6B active, MXFP4; 32 experts, top 4)",
        experts=32,
        top_k=4,
    ),
}


@dataclass(frozen=True)
class Clock:
    """A preset's roofline on ``gpus`` accelerators (bandwidth and FLOPs add up
    across the tensor-parallel group).  ``layers``: the model's layers, for
    the eager launches; ``graph_batch``: the engine's largest decode CUDA
    graph, ``prefill_graph``: the most tokens a prefill or mixed pass's graph
    holds (None: no limit); ``chunk_tokens``: a prefill pass's token budget;
    ``mixed``: a chunk rides a decode iteration instead of running alone."""

    accel: Accelerator
    model: Model
    page_tokens: int
    layers: int = 0
    graph_batch: int | None = None
    prefill_graph: int | None = None
    chunk_tokens: int = SGLANG_CHUNKED_PREFILL
    mixed: bool = False

    @property
    def bandwidth(self):
        return self.accel.memory_bandwidth * self.model.gpus

    @property
    def flops(self):
        return self.accel.peak_flops * self.model.gpus

    def iteration_seconds(self, tokens, kv_bytes):
        """One forward pass over ``tokens`` tokens (decode and prefill alike)
        that reads ``kv_bytes`` of KV and state and the weights its batch
        touches (``Model.weights_read``)."""
        if tokens <= 0:
            return 0.0
        m = self.model
        return max((m.weights_read(tokens) + kv_bytes) / self.bandwidth, 2 * m.params_active * tokens / self.flops)

    def _eager(self, tokens, graph):
        if graph is None or tokens <= graph:
            return 0.0
        return self.layers * EAGER_LAUNCHES_PER_LAYER * self.accel.launch_seconds

    def eager_seconds(self, decode_tokens):
        """The launches of a decode iteration whose batch no CUDA graph holds."""
        return self._eager(decode_tokens, self.graph_batch)

    def chunk_budget(self, decode_tokens):
        """Prefill tokens one pass takes: the chunk, less the decodes that
        share it when mixed (at least one)."""
        return max(self.chunk_tokens - decode_tokens, 1) if self.mixed else self.chunk_tokens

    def step_seconds(self, decode_tokens, prefill_tokens, kv_bytes):
        """``page_tokens`` decode iterations of ``decode_tokens`` (one per
        decoding request) reading ``kv_bytes``, and ``prefill_tokens`` in
        passes of at most ``chunk_budget`` tokens: each a forward of its own,
        or, mixed, one decode iteration's extra tokens."""
        budget = self.chunk_budget(decode_tokens)
        full, rest = divmod(prefill_tokens, budget)
        passes = ((budget, full), (rest, int(rest > 0)))  # (tokens a pass, how many passes)
        decode = self.iteration_seconds(decode_tokens, kv_bytes) + self.eager_seconds(decode_tokens)
        extra = decode_tokens if self.mixed else 0  # a mixed pass also carries the decodes
        kv = kv_bytes if self.mixed else 0  # and reads their KV; a pass of its own reads none
        prefill = sum(
            n * (self.iteration_seconds(extra + c, kv) + self._eager(extra + c, self.prefill_graph)) for c, n in passes
        )
        decode_only = self.page_tokens - (full + passes[1][1] if self.mixed else 0)  # iterations no chunk rides
        return max(decode_only, 0) * decode + prefill

    def copy_seconds(self, moved_bytes):
        """Relocating ``moved_bytes``: each read and written once."""
        return 2 * moved_bytes / (COPY_EFFICIENCY * self.bandwidth)

    def launch_seconds(self, launches):
        """``launches`` kernel launches from the host."""
        return launches * self.accel.launch_seconds


def clock(preset_name, accel="h200", page_tokens=16, layers=0, graph_batch=None, **passes):
    """``preset_name``'s clock on ``accel``; ``passes``: ``Clock``'s
    ``prefill_graph``, ``chunk_tokens`` and ``mixed``."""
    try:
        a = ACCELERATORS[accel]
    except KeyError:
        raise ValueError(f"unknown accelerator {accel!r}; accelerators: {', '.join(ACCELERATORS)}") from None
    try:
        m = MODELS[preset_name]
    except KeyError:
        raise ValueError(f"preset {preset_name!r} has no model parameters for the time model") from None
    return Clock(a, m, page_tokens, layers, graph_batch, **passes)


def sglang_mem_fraction_static(accel="h200", tp=1):
    """SGLang 0.5.23's default ``mem_fraction_static`` on ``tp`` of ``accel``
    (``memory_hook.py``: the reserve is 512 MiB, 1.5 MiB a chunked-prefill
    token, 128 MiB a TP rank, and the CUDA graphs' ``2 x decode_max_bs + 8 x
    prefill sizes`` MiB, at least 10 GiB on a device above 60 GiB)."""
    a = ACCELERATORS[accel]
    mib = a.memory / MIB
    graphs = SGLANG_DECODE_GRAPH_BS * 2 + SGLANG_PREFILL_GRAPH_SIZES * 8
    reserved = 512 + max(SGLANG_CHUNKED_PREFILL, 2048) * 1.5 + tp / 8 * 1024 + graphs
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


def kv_budget_bytes(preset_name, accel="h200", mem_fraction_static=None):
    """What the engine leaves for the KV cache on ``preset_name``'s
    tensor-parallel group: its memory times ``mem_fraction_static`` (the
    share SGLang gives weights and KV, by default SGLang's own,
    ``sglang_mem_fraction_static``; the rest holds activations and CUDA graphs),
    less the weights.  Raises ``ValueError`` when nothing is left."""
    c = clock(preset_name, accel)
    frac = sglang_mem_fraction_static(accel, c.model.gpus) if mem_fraction_static is None else mem_fraction_static
    if not 0 < frac <= 1:
        raise ValueError(f"preset {preset_name!r}: mem_fraction_static must be in (0, 1], got {frac}")
    left = c.model.gpus * c.accel.memory * frac - c.model.weight_bytes
    if left <= 0:
        raise ValueError(
            f"preset {preset_name!r}: {c.model.gpus} x {accel} at mem_fraction_static {frac} "
            f"leaves no memory for the KV cache after {c.model.weight_bytes / GB:.1f} GB of weights"
        )
    return left
