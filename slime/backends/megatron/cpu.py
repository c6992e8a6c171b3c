"""Run megatron-core on the CPU: redirect its hard-coded CUDA uses inside its own modules (gloo ranks).

What ``slime-submit smoke`` and the CPU tests use to run the user's Megatron path without a GPU.
megatron-core places a few buffers with ``device='cuda'`` / ``torch.cuda.current_device()``, pins
memory, forks a CUDA RNG tracker around dropout (and saves its state around a recompute), accepts
only parameters whose ``type()`` names a CUDA tensor in the distributed optimizer, and moves the
all-to-all dispatcher's split sizes to the host on a side CUDA stream. ``cpu_shim()`` sends exactly
those to the CPU; the maths is unchanged. Call it in a CPU-only process before building models.
"""

from __future__ import annotations

import sys

__all__ = ["cpu_shim"]


_applied = False


def cpu_shim() -> None:
    """Send megatron-core's hard-coded ``device='cuda'`` allocations to the CPU (its modules only). Once per
    process: a worker that runs several jobs calls it for each, and the patches wrap what they replace."""
    global _applied
    if _applied:
        return
    _applied = True
    _torch_cuda()
    _megatron_modules()
    _rng_and_dispatcher()


def _torch_cuda() -> None:
    """torch's CUDA entry points megatron calls, as CPU no-ops (one stream, CPU tensors typed as CUDA)."""
    import contextlib
    import types

    import torch

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.Tensor.cuda = lambda self, *a, **k: self
    tensor_type = torch.Tensor.type

    def cuda_type(self, *a, **k):  # the distributed optimizer accepts only torch.cuda.*Tensor parameters
        name = tensor_type(self, *a, **k)
        return name.replace("torch.", "torch.cuda.", 1) if not (a or k or self.is_cuda) else name

    torch.Tensor.type = cuda_type

    class Stream:  # the all-to-all token dispatcher copies split sizes to the host on a side stream
        def __new__(cls, *a, **k):
            if not hasattr(cls, "_one"):
                cls._one = super().__new__(cls)  # one stream: current_stream() is the side stream
            return cls._one

        def wait_stream(self, other):
            pass

        def record_event(self, *a):
            return types.SimpleNamespace(synchronize=lambda: None, wait=lambda *a: None)

    torch.cuda.Stream = Stream
    torch.cuda.current_stream = lambda *a, **k: Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()


def _megatron_modules() -> None:
    """Inside megatron's modules, ``torch.zeros(..., device='cuda')`` and the like allocate on the CPU."""
    import types

    import torch

    def fix(kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        kwargs.pop("pin_memory", None)  # the CP rotary chunk index is built pinned, then moved to CUDA
        return kwargs

    class TorchProxy(types.ModuleType):
        def __getattr__(self, name):
            obj = getattr(torch, name)
            if name in ("tensor", "zeros", "empty", "ones", "full", "arange"):
                return lambda *a, **k: obj(*a, **fix(k))
            return obj

    import megatron.core.distributed.distributed_data_parallel
    import megatron.core.distributed.param_and_grad_buffer
    import megatron.core.optimizer.clip_grads
    import megatron.core.optimizer.optimizer  # noqa: F401

    proxy = TorchProxy("torch")
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("megatron.core") and getattr(mod, "torch", None) is torch:
            mod.torch = proxy


def _rng_and_dispatcher() -> None:
    """No CUDA RNG tracker or state; the MoE dispatcher's split sizes stay host arrays."""
    import contextlib

    import megatron.core.tensor_parallel as mtp
    import torch

    class NoRng:
        def fork(self, *a, **k):
            return contextlib.nullcontext()

    mtp.get_cuda_rng_tracker = lambda *a, **k: NoRng()
    import megatron.core.tensor_parallel.random as mrandom

    # activation recompute (recompute-granularity) saves and restores the CUDA RNG around each replay
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda *a, **k: None

    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as dispatcher

    move = moe_utils.maybe_move_tensor_to_cpu

    def to_host(tensor, as_numpy=False, record_stream=False):  # split sizes arrive as host lists on GPU
        if torch.is_tensor(tensor) and not tensor.is_cuda and as_numpy:
            return tensor.numpy()
        return move(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = dispatcher.maybe_move_tensor_to_cpu = to_host
