"""Stand-ins for the ``sgl_kernel`` CPU ops SGLang's CPU engine calls.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports its CPU kernels
from ``sgl_kernel``, whose CPU build is not on PyPI; the wheel there is
CUDA-only and pulls a CUDA torch.  On a machine without it, ``install()``
answers ``import sgl_kernel`` with a module of plain torch reference
implementations, under the names SGLang looks up:

- ``assign_req_to_token_pool_cpu`` (``sglang.srt.mem_cache.allocation``):
  writes each request's new token ids into its row of ``req_to_token``,
  the CPU twin of the Triton kernel ``assign_req_to_token_pool``.

Two more stand in for SGLang's Triton kernels that Triton's interpreter
cannot run, in the module SGLang's models import them from
(``sglang.srt.layers.attention.mamba.causal_conv1d``, replaced there right
after it is imported; ``_HAS_CONV1D_KERNEL = is_cuda()`` at its line 27
sends a CPU tensor to Triton, and the interpreter stops at
``kernels/ops/mamba/causal_conv1d_triton.py:405``, "mask has unsupported
dtype"):

- ``causal_conv1d_fn``: the depthwise causal convolution of a prefill
  (sequences concatenated, each starting from its conv state or from
  zeros), which leaves each sequence's last ``width - 1`` inputs as its
  conv state (LFM2's short convolution, Mamba2's input convolution);
- ``causal_conv1d_update``: the decode step's, one or more new tokens per
  sequence through its conv state, rolled forward in place.

An op with no stand-in raises ``NotImplementedError`` naming it when it is
called (an import of it succeeds, as SGLang imports its CPU ops at module
level whether or not the model calls them); a ``torch.ops.sgl_kernel`` op
with none raises torch's own error naming it.  Nothing here runs when the
real ``sgl_kernel`` is installed (on CUDA, SGLang's real kernels run).

Each stand-in is tested against an independent reference on random inputs
(tests/sglang/test_cpu_ops.py).  ``kvarena.sglang.engine.cpu_environment``
puts ``cpu_boot/`` on the engine processes' path, whose ``sitecustomize``
calls ``install()`` at interpreter start.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

import torch

NAME = "sgl_kernel"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = `` request i's
    slice of ``out_cache_loc`` (the requests' new ids, concatenated in
    order).  One scatter, no loop over requests or tokens."""
    lens = (end_offset - start_offset).to(torch.int64)
    rows = torch.repeat_interleave(req_pool_indices.to(torch.int64), lens)
    first = torch.cumsum(lens, 0) - lens  # where each request's ids start in out_cache_loc
    cols = torch.arange(int(lens.sum()), dtype=torch.int64) - torch.repeat_interleave(first, lens)
    cols += torch.repeat_interleave(start_offset.to(torch.int64), lens)
    req_to_token[rows, cols] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


STANDINS = {"assign_req_to_token_pool_cpu": assign_req_to_token_pool_cpu}


def _activate(y: torch.Tensor, activation: str | bool | None) -> torch.Tensor:
    if activation in (None, False):
        return y
    if activation in (True, "silu", "swish"):
        return torch.nn.functional.silu(y)
    raise NotImplementedError(f"causal_conv1d: activation must be None, silu or swish, got {activation!r}")


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    query_start_loc: torch.Tensor | None = None,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    conv_states: torch.Tensor | None = None,
    activation: str | None = "silu",
    pad_slot_id: int = -1,
    **kwargs: object,
) -> torch.Tensor:
    """A prefill's depthwise causal convolution.  ``x`` is ``[dim, tokens]``
    (sequences concatenated, ``query_start_loc`` their bounds) or ``[batch,
    dim, seqlen]``; ``weight`` ``[dim, width]``; sequence i starts from
    ``conv_states[cache_indices[i]]`` (``[dim, width - 1]``) where
    ``has_initial_state[i]``, else from zeros, and its last ``width - 1``
    inputs become that conv state.  Output: ``x``'s shape, zeros for a
    sequence whose slot is ``pad_slot_id``.  A loop over the width only."""
    if x.dim() == 3:
        b, dim, length = x.shape
        starts = torch.arange(0, (b + 1) * length, length)
        y = causal_conv1d_fn(
            x.transpose(0, 1).reshape(dim, b * length),
            weight,
            bias,
            starts,
            cache_indices,
            has_initial_state,
            conv_states,
            activation,
            pad_slot_id,
        )
        return y.reshape(dim, b, length).transpose(0, 1)
    dim, total = x.shape
    width = weight.shape[1]
    keep = width - 1
    qsl = torch.tensor([0, total]) if query_start_loc is None else query_start_loc.to(torch.int64)
    lens = qsl[1:] - qsl[:-1]
    n = lens.numel()
    seq = torch.repeat_interleave(torch.arange(n), lens, output_size=total)  # each token's sequence
    pos = torch.arange(total) - qsl[:-1][seq]  # each token's position in its sequence
    slots = torch.arange(n) if cache_indices is None else cache_indices.to(torch.int64)
    live = slots != pad_slot_id
    init = torch.zeros(n, dim, keep, dtype=torch.float32)
    if conv_states is not None and has_initial_state is not None:
        from_state = has_initial_state.to(torch.bool) & live
        init[from_state] = conv_states[slots[from_state]].float()
    xf = x.float()
    y = torch.zeros(dim, total, dtype=torch.float32)
    for k in range(width):  # tap k reads the input keep - k tokens back
        back = pos - (keep - k)  # that input's position in its sequence; below 0, it is in the conv state
        from_x = xf[:, (torch.arange(total) - (keep - k)).clamp(min=0)]
        from_state = init[seq, :, (keep + back).clamp(0, max(keep - 1, 0))].T if keep else from_x
        y += weight[:, k : k + 1].float() * torch.where(back >= 0, from_x, from_state)
    if bias is not None:
        y += bias.float()[:, None]
    y = _activate(y, activation) * live[seq].to(torch.float32)
    if conv_states is not None and keep:
        # the state after the prefill: the last `keep` inputs of [init | x], per sequence
        last = qsl[1:][:, None] - keep + torch.arange(keep)  # token index of each kept input
        from_x = last >= qsl[:-1][:, None]
        grabbed = xf[:, last.clamp(min=0)].permute(1, 0, 2)  # [n, dim, keep]
        back = (keep + last - qsl[:-1][:, None]).clamp(0, keep - 1)  # where the rest sit in the old state
        carried = init.gather(2, back[:, None, :].expand(n, dim, keep))
        state = torch.where(from_x[:, None, :], grabbed, carried)
        conv_states[slots[live]] = state[live].to(conv_states.dtype)
    return y.to(x.dtype)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """A decode step's causal convolution: ``x`` is ``[batch, dim]`` or
    ``[batch, dim, seqlen]``; sequence i's window is ``conv_state[
    conv_state_indices[i]]`` followed by its new inputs, and the window's
    last ``width - 1`` inputs are written back.  Zeros out for a padded
    slot.  The circular-buffer form (``cache_seqlens``) has no stand-in."""
    if cache_seqlens is not None:
        raise NotImplementedError("causal_conv1d_update: kvarena's stand-in has no circular-buffer conv state")
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    batch = xs.shape[0]
    width = weight.shape[1]
    keep = conv_state.shape[-1]
    slots = torch.arange(batch) if conv_state_indices is None else conv_state_indices.to(torch.int64)
    live = slots != pad_slot_id
    window = torch.cat([conv_state[slots.clamp(min=0)].float(), xs.float()], dim=-1)  # [batch, dim, keep + length]
    taps = window[..., keep - (width - 1) :].unfold(-1, width, 1)  # [batch, dim, length, width]
    y = (taps * weight.float()[None, :, None, :]).sum(-1)
    if bias is not None:
        y += bias.float()[None, :, None]
    y = _activate(y, activation) * live[:, None, None].to(torch.float32)
    conv_state[slots[live]] = window[live][..., -keep:].to(conv_state.dtype)
    y = y.to(x.dtype)
    return y.squeeze(-1) if squeeze else y


# SGLang's modules whose functions the stand-ins replace, right after the module is imported
REPLACED = {
    "sglang.srt.layers.attention.mamba.causal_conv1d": {
        "causal_conv1d_fn": causal_conv1d_fn,
        "causal_conv1d_update": causal_conv1d_update,
    }
}


# the submodules SGLang's CPU path imports ops from at module level; any other is missing, so the import fails
# and SGLang takes its fallback (sglang.srt.layers.quantization.utils, for one, tries sgl_kernel.scalar_type)
SUBMODULES = {f"{NAME}.mamba"}


def _missing(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"{name}: kvarena has no CPU stand-in for this op (kvarena/sglang/cpu_ops.py lists those it "
            f"has); on CUDA install SGLang's sgl_kernel"
        )

    op.__name__ = name
    return op


def module(name: str = NAME) -> types.ModuleType:
    """The stand-in ``sgl_kernel`` module, or one of its submodules (SGLang
    imports its CPU ops from ``sgl_kernel.mamba`` too)."""
    mod = types.ModuleType(name, "kvarena's CPU stand-ins for sgl_kernel (kvarena.sglang.cpu_ops)")
    if name == NAME:
        mod.__dict__.update(STANDINS)
    mod.__path__ = []  # a package, whose SUBMODULES the finder answers too

    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _missing(f"{name}.{attr}")

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


# torch.ops.sgl_kernel ops that SGLang's CPU path looks up when a module is imported, whatever the model
# (layers/attention/linear/kernels/gdn_triton.py:32, gdn_backend.py:188: the gated delta rule of Qwen3-Next's
# linear attention).  No model kvarena's tests serve calls them; each is declared with its schema, and a call
# raises NotImplementedError naming it.
DECLARED = {
    "fused_gdn_gating_cpu": "(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias, float beta=1.0, "
    "float threshold=20.0) -> (Tensor, Tensor)",
    "fused_sigmoid_gating_delta_rule_update_cpu": "(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, "
    "Tensor a, Tensor b, Tensor(a!) initial_state_source, Tensor initial_state_indices, Tensor? cu_seqlens=None, "
    "bool use_qk_l2norm_in_kernel=False, float softplus_beta=1.0, float softplus_threshold=20.0, "
    "float? scale=None, bool is_kda=False, bool disable_state_update=False, "
    "Tensor(b!)? intermediate_states_buffer=None, Tensor? intermediate_state_indices=None, int? cache_steps=None, "
    "Tensor? retrieve_parent_token=None) -> Tensor",
}
_LIBRARY: list = []  # the torch.library fragment, kept alive


def _declare_ops() -> None:
    if _LIBRARY:  # declared once a process (install() runs only without the real sgl_kernel)
        return
    lib = torch.library.Library(NAME, "FRAGMENT")
    for name, schema in DECLARED.items():
        lib.define(name + schema)
        lib.impl(name, _missing(f"torch.ops.{NAME}.{name}"), "CompositeExplicitAutograd")
    _LIBRARY.append(lib)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds a module of ``REPLACED`` as the other finders do, and replaces
    its functions by the stand-ins right after it runs (before a model's
    ``from ... import`` binds them)."""

    def find_spec(self, name, path, target=None):
        if name not in REPLACED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            vars(module).update(REPLACED[name])

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        ours = name == NAME or name in SUBMODULES
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if ours else None

    def create_module(self, spec):
        return module(spec.name)

    def exec_module(self, module):
        pass


def install() -> bool:
    """Answer ``import sgl_kernel`` with the stand-ins, and replace the
    Triton kernels the interpreter cannot run, unless the real
    ``sgl_kernel`` is installed (then SGLang's own kernels run); True when
    the stand-ins are in place."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    if importlib.util.find_spec(NAME) is not None:
        return False
    sys.meta_path[:0] = [_Finder(), _AfterImport()]
    _declare_ops()
    for name, functions in REPLACED.items():
        if name in sys.modules:
            vars(sys.modules[name]).update(functions)
    return True
