"""A fake CuPy (and fake PyTorch CUDA tensors) that check fastflip's GPU path without a GPU.

Installed with ``monkeypatch.setitem(sys.modules, "cupy", FakeCupy(lib))`` (see :func:`install`). "Device
memory" is host memory, so the kernels that run are the real CUDA C source
(:data:`fastflip.kernels.gpu_kernels.CUDA_SOURCE`, compiled for the host with ``-DFF_HOST`` as in
tests/test_gpu_source.py) and the results can be checked against the NumPy oracle. What a simulator cannot
check is recorded instead, as a real GPU would see it:

- every array is made on the device current at that moment; a kernel is bound to the device current when
  it was fetched from its module (CuPy's ``RawModule.get_function``). A launch from another device, or with
  an array argument of another device, raises (a real GPU faults or refuses the handle);
- every compile (``get_function``), launch, synchronisation, event record and stream wait is appended to
  ``fake.log`` with the device and the current stream pointer of that moment;
- ``fail_compile`` makes ``get_function`` raise like a missing NVRTC; ``fail_launch(name, device)`` makes
  a launch raise like a CUDA error.
"""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any, Callable

import numpy as np

from fastflip.kernels import gpu as kc
from fastflip.kernels import gpu_kernels

ARGS = {"apply": 10, "read": 6, "write": 6}  # pointer arguments of each kernel (then n)


def host_library(directory: str, compiler: str) -> Any:
    """The host build of the CUDA source with ctypes signatures (one per test session)."""
    lib = gpu_kernels.build_host_library(directory, compiler)
    for name, nargs in ARGS.items():
        fn = getattr(lib, f"ff_{name}")
        fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_longlong]
        fn.restype = None
    return lib


class CompileException(Exception):
    """What CuPy raises when NVRTC is missing or fails (``cupy.cuda.compiler.CompileException``)."""


class CUDARuntimeError(RuntimeError):
    """What CuPy raises for a failed launch."""


class FakeCupy(types.ModuleType):
    """The part of CuPy fastflip uses, over host memory, with ``n_devices`` fake devices."""

    def __init__(self, lib: Any, n_devices: int = 2) -> None:
        super().__init__("cupy")
        fake = self
        self.lib = lib
        self.log: list[tuple] = []
        self.fail_compile = False
        self.fail_launch: Callable[[str, int], bool] = lambda name, device: False
        self.current = 0
        self.uint8, self.uint64, self.int64, self.bool_ = np.uint8, np.uint64, np.int64, np.bool_
        self._next_stream = 0x1000

        class Stream:
            def __init__(self, ptr: int | None = None, device: int | None = None) -> None:
                if ptr is None:
                    fake._next_stream += 0x10
                    ptr = fake._next_stream
                self.ptr, self.device_id = int(ptr), fake.current if device is None else device

            def __enter__(self) -> "Stream":
                fake.stacks[self.device_id].append(self)
                return self

            def __exit__(self, *exc: Any) -> None:
                assert fake.stacks[self.device_id].pop() is self

            def synchronize(self) -> None:
                fake.log.append(("sync", self.device_id, self.ptr))

            def record(self) -> tuple[str, int]:
                fake.log.append(("record", self.device_id, self.ptr))
                return ("event", self.ptr)

            def wait_event(self, event: tuple[str, int]) -> None:
                fake.log.append(("wait", self.device_id, self.ptr, event[1]))

        self.stacks = {d: [Stream(0, d)] for d in range(n_devices)}

        class Device:
            def __init__(self, device: int | None = None) -> None:
                self.id = fake.current if device is None else int(device)
                if not 0 <= self.id < n_devices:
                    raise CUDARuntimeError(f"cudaErrorInvalidDevice: {self.id}")
                self._saved: list[int] = []

            def __enter__(self) -> "Device":
                self._saved.append(fake.current)
                fake.current = self.id
                return self

            def __exit__(self, *exc: Any) -> None:
                fake.current = self._saved.pop()

        class Memory:  # UnownedMemory and MemoryPointer: an address on a device
            def __init__(self, ptr: Any, size: int = 0, owner: Any = None, device_id: int | None = None) -> None:
                if isinstance(ptr, Memory):  # MemoryPointer(mem, offset)
                    ptr, device_id = ptr.ptr + size, ptr.device_id
                self.ptr, self.device_id, self.owner = int(ptr), device_id, owner

        class ndarray:
            """A host NumPy array ``_a`` that lives on fake device ``device.id``."""

            def __init__(self, shape: Any, dtype: Any = np.uint8, memptr: Memory | None = None, *,
                         _a: np.ndarray | None = None, _device: int | None = None) -> None:
                if _a is None:  # a view of existing (device) memory, as device_span builds it
                    assert memptr is not None
                    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
                    raw = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(memptr.ptr))
                    _a, _device, self._owner = raw.view(dtype).reshape(shape), memptr.device_id, memptr.owner
                self._a = _a
                self.device = types.SimpleNamespace(id=fake.current if _device is None else _device)
                self.data = types.SimpleNamespace(ptr=int(_a.ctypes.data))
                self.dtype, self.shape, self.strides = _a.dtype, _a.shape, _a.strides

            def __len__(self) -> int:
                return len(self._a)

            def __getitem__(self, key: Any) -> "ndarray":
                fake._same_device(self, key)
                return fake._wrap(self._a[fake._host(key)])

            def __setitem__(self, key: Any, value: Any) -> None:
                fake._same_device(self, key, value)
                self._a[fake._host(key)] = fake._host(value)

        ndarray.__module__ = "cupy"  # what fastflip.live.adapters looks for
        self.ndarray = ndarray

        class Function:
            def __init__(self, name: str) -> None:
                self.name, self.device = name, fake.current

            def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
                dev, stream = fake.current, fake.cuda.get_current_stream()
                fake.log.append(("launch", self.name, dev, stream.ptr))
                if self.device != dev:
                    raise CUDARuntimeError(f"{self.name} was loaded on device {self.device}, launched on {dev}")
                for a in args:
                    if isinstance(a, ndarray) and a.device.id != dev:
                        raise CUDARuntimeError(f"{self.name} on device {dev} got an array of device {a.device.id}")
                if fake.fail_launch(self.name, dev):
                    raise CUDARuntimeError(f"cudaErrorLaunchFailure: {self.name} on device {dev}")
                ptrs = [a.data.ptr if isinstance(a, ndarray) else int(a) for a in args]
                getattr(fake.lib, self.name)(*ptrs)

        class RawModule:
            def __init__(self, code: str) -> None:
                assert code == gpu_kernels.CUDA_SOURCE
                self.code = code

            def get_function(self, name: str) -> Function:
                fake.log.append(("compile", name, fake.current))
                if fake.fail_compile:
                    raise CompileException("nvrtc: error: failed to load libnvrtc.so.12\nmore detail")
                return Function(name)

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(
            Device=Device, Stream=Stream, ExternalStream=lambda ptr: Stream(ptr),
            get_current_stream=lambda: fake.stacks[fake.current][-1], UnownedMemory=Memory, MemoryPointer=Memory,
            runtime=types.SimpleNamespace(getDeviceCount=lambda: n_devices))

    # ------------------------------------------------------------------ array functions

    def _wrap(self, a: np.ndarray) -> Any:
        return self.ndarray(None, _a=np.ascontiguousarray(a), _device=self.current)

    def _host(self, x: Any) -> Any:
        return x._a if isinstance(x, self.ndarray) else x

    def _same_device(self, *arrays: Any) -> None:
        devs = {a.device.id for a in arrays if isinstance(a, self.ndarray)}
        if len(devs) > 1 or (devs and devs != {self.current}):
            raise CUDARuntimeError(f"arrays of devices {sorted(devs)} used on device {self.current}")

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        if isinstance(a, self.ndarray) and a.device.id == self.current and (dtype is None or a.dtype == dtype):
            return a
        self.log.append(("copy", self.current, self.cuda.get_current_stream().ptr))
        return self._wrap(np.array(self._host(a), dtype=dtype))

    def ascontiguousarray(self, a: Any) -> Any:
        return self.asarray(a)

    def empty(self, n: int, dtype: Any) -> Any:
        return self._wrap(np.empty(n, dtype=dtype))

    def asnumpy(self, a: Any) -> np.ndarray:
        return np.array(self._host(a))

    def launches(self) -> list[tuple]:
        return [e for e in self.log if e[0] == "launch"]


def install(monkeypatch: Any, lib: Any, n_devices: int = 2) -> FakeCupy:
    """Put a fresh :class:`FakeCupy` in ``sys.modules`` and empty fastflip's GPU caches (restored after the test)."""
    from fastflip.kernels import registry

    fake = FakeCupy(lib, n_devices)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(gpu_kernels, "_KERNELS", {})
    monkeypatch.setattr(kc, "_EXTERNAL", {}, raising=False)
    monkeypatch.setattr(registry, "_LOADED", {})
    monkeypatch.setattr(registry, "_FAILED", {})
    return fake


class _TorchDtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


class TorchCudaTensor:
    """What :mod:`fastflip.live.adapters` reads of a PyTorch CUDA tensor, over a host array on a fake device."""

    def __init__(self, a: np.ndarray, device: int) -> None:
        self._a = np.ascontiguousarray(a)
        kind = {"f": "float", "i": "int", "u": "uint"}[self._a.dtype.kind]
        self.dtype = _TorchDtype(f"{kind}{8 * self._a.itemsize}")
        self.device = types.SimpleNamespace(type="cuda", index=device)
        self.shape = self._a.shape

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self._a.itemsize for s in self._a.strides)

    def data_ptr(self) -> int:
        return int(self._a.ctypes.data)

    def numpy(self) -> np.ndarray:
        return self._a


TorchCudaTensor.__module__ = "torch"
