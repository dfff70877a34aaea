"""A CUDA device on a machine without one, for tests of where prepack.hf's tensors live.

``to_device(model)`` gives every parameter and buffer of a model the type ``OnDevice``: a tensor
that reports device ``cuda:0`` and holds its values in a CPU tensor. Inside ``virtual_cuda()``,
factory functions and ``.to()`` that name ``cuda`` make ``OnDevice`` tensors, every operation on
them computes on the CPU, and what CUDA refuses is refused the same way:

- an operation that mixes an ``OnDevice`` tensor with a host tensor of one or more dimensions
  (CUDA takes host scalars, 0-d tensors and, for advanced indexing, host indices; so does this);
- ``.numpy()`` (and so ``np.asarray``) of an ``OnDevice`` tensor.

The mode records each host-to-device copy (``h2d``: ``.to()``, ``copy_`` into a device tensor) and
device-to-host copy (``d2h``) with its number of elements, so a test can bound what crosses the bus: a causal mask built on the host and
copied shows up as a copy of rows x width^2 elements.

What it cannot see: CUDA's own kernels (the values are the CPU kernels'; where CUDA takes a dtype
the CPU kernel does not, histc of integers, the CPU kernel runs on a float copy), compiled code
(torch.compile is off inside virtual_cuda(); flex attention's higher-order operator runs
uncompiled, its functions over the values, once every tensor it is given or its functions hold
is checked to be on the device), streams and events."""
import contextlib
import types
from typing import Iterator, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

DEVICE = torch.device("cuda", 0)
# Operations CUDA runs with host indices (advanced indexing copies them to the device), and
# copies between devices.
_HOST_INDICES = {"index", "index_put", "index_put_", "_index_put_impl_", "copy_"}


class OnDevice(torch.Tensor):
    """A tensor on DEVICE whose values live in ``self.inner``, a CPU tensor."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, device=DEVICE, requires_grad=False)

    def __init__(self, inner: torch.Tensor):
        self.inner = inner

    def __repr__(self):
        return f"OnDevice({self.inner!r})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.tolist:  # a read back, as on CUDA
            return args[0].inner.tolist()
        if func in (torch.Tensor.numpy, torch.Tensor.__array__):
            raise TypeError(f"can't convert {DEVICE} device type tensor to numpy. Use "
                            f"Tensor.cpu() to copy the tensor to host memory first.")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # outside virtual_cuda() (a model moved to the device, then used later): same rules,
        # nothing recorded
        return VirtualDevice.__torch_dispatch__(_UNRECORDED, func, types, args, kwargs)


class VirtualDevice(TorchDispatchMode):
    """Runs operations on OnDevice tensors on the CPU with CUDA's device rules (module doc)."""

    supports_higher_order_operators = True

    def __init__(self):
        super().__init__()
        self.h2d: List[Tuple[str, int]] = []
        self.d2h: List[Tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return _higher_order(func, args, kwargs)
        on_device = False
        host: List[torch.Tensor] = []

        def unwrap(x):
            nonlocal on_device
            if isinstance(x, OnDevice):
                on_device = True
                return x.inner
            if isinstance(x, torch.Tensor) and x.dim() > 0:
                host.append(x)
            return x

        into_device = bool(args) and isinstance(args[0], OnDevice)
        args, kwargs = tree_map(unwrap, (args, kwargs))
        device = kwargs.get("device")
        device = None if device is None else torch.device(device)
        to_device = device is not None and device.type == "cuda"
        if to_device:
            kwargs = dict(kwargs, device=torch.device("cpu"))
        name = func.overloadpacket.__name__
        if name == "_to_copy":
            if to_device and not on_device:
                self.h2d.append((str(func), args[0].numel()))
            elif on_device and device is not None and device.type == "cpu":
                self.d2h.append((str(func), args[0].numel()))
                return func(*args, **kwargs)
        elif name == "copy_" and into_device and host and host[0] is args[1]:
            self.h2d.append((str(func), args[1].numel()))  # a host tensor copied in
        elif on_device and host and name not in _HOST_INDICES:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at "
                               f"least two devices, {DEVICE} and cpu! ({func}: host tensors of "
                               f"shapes {[tuple(h.shape) for h in host]})")
        if name == "histc" and not args[0].is_floating_point():
            # CUDA's histc takes integers (transformers' MoE routing gives it int32 on CUDA
            # only); the CPU kernel takes floats: the same counts, in the input's dtype
            out = func(args[0].double(), *args[1:], **kwargs).to(args[0].dtype)
        else:
            out = func(*args, **kwargs)
        if on_device or to_device:
            return tree_map(lambda x: OnDevice(x) if isinstance(x, torch.Tensor) else x, out)
        return out

    def largest_h2d(self) -> int:
        return max((n for _, n in self.h2d), default=0)


def _higher_order(func, args, kwargs):
    """A higher-order operator (flex attention) on the CPU: every tensor it is given, and every
    tensor its functions (score_mod, mask_mod) close over, must be on the device, as compiled
    CUDA code needs; it then runs on the values, its functions rebuilt over them."""
    host: List[torch.Tensor] = []

    def unwrap(x):
        if isinstance(x, OnDevice):
            return x.inner
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            host.append(x)
        if isinstance(x, types.FunctionType) and x.__closure__:
            cells = tuple(types.CellType(unwrap(c.cell_contents)) for c in x.__closure__)
            return types.FunctionType(x.__code__, x.__globals__, x.__name__, x.__defaults__, cells)
        return x

    args, kwargs = tree_map(unwrap, (args, kwargs))
    if host:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least "
                           f"two devices, {DEVICE} and cpu! ({func}: host tensors of shapes "
                           f"{[tuple(h.shape) for h in host]})")
    out = func(*args, **kwargs)
    return tree_map(lambda x: OnDevice(x) if isinstance(x, torch.Tensor) else x, out)


_UNRECORDED = VirtualDevice()


@contextlib.contextmanager
def virtual_cuda() -> Iterator[VirtualDevice]:
    """The mode above, with torch's CUDA initialisation off (there is no driver), as torch's own
    FakeTensorMode does for CUDA tensors on a CPU-only machine."""
    lift = torch._C._only_lift_cpu_tensors()
    torch._C._set_only_lift_cpu_tensors(True)
    torch._C._ensureCUDADeviceGuardSet()
    lazy_init, capability = torch.cuda._lazy_init, torch.cuda.get_device_capability
    torch.cuda._lazy_init = lambda: None
    # an older card's capability, so that transformers picks kernels the CPU also has (its MoE
    # layers use torch._grouped_mm from 8.0)
    torch.cuda.get_device_capability = lambda device=None: (7, 5)
    try:
        with uncompiled(), VirtualDevice() as mode:
            yield mode
    finally:
        torch.cuda._lazy_init, torch.cuda.get_device_capability = lazy_init, capability
        torch._C._set_only_lift_cpu_tensors(lift)


@contextlib.contextmanager
def uncompiled() -> Iterator[None]:
    """torch.compile off: compiled functions, flex attention's among them, run as written
    (torch.compile cannot trace under a dispatch mode)."""
    from torch.nn.attention import flex_attention

    dynamo = torch._dynamo.config.disable
    flex = flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    torch._dynamo.config.disable = flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        yield
    finally:
        torch._dynamo.config.disable = dynamo
        flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = flex


def to_device(model: torch.nn.Module) -> torch.nn.Module:
    """The model with every parameter and buffer an OnDevice tensor (in place, returned; those
    on the device already are kept)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and not isinstance(p, OnDevice):
                module._parameters[name] = torch.nn.Parameter(OnDevice(p.data), requires_grad=False)
        for name, b in list(module._buffers.items()):
            if b is not None and not isinstance(b, OnDevice):
                module._buffers[name] = OnDevice(b)
    return model


def host(x):
    """x with every OnDevice tensor (nested in lists, tuples, dicts) read back to the host."""
    return tree_map(lambda t: t.inner.clone() if isinstance(t, OnDevice) else t, x)
