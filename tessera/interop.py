"""Zero-copy interop: CuPy arrays and any DLPack tensor (PyTorch, JAX) in, the caller's type out.

Kernels only need a pointer, a shape, element strides and a dtype, so inputs are described by a
small :class:`DeviceTensor` read straight from the DLPack capsule (ctypes). That is also how
bfloat16 passes through from producers whose arrays CuPy cannot hold (CuPy 14 holds bfloat16
only with ml_dtypes; DLPack always can). PyTorch tensors are described
from their own attributes instead (``data_ptr``, ``stride``; still no copy): torch's
``__dlpack__`` makes a stream wait on an event unless asked with its current stream, which a
CUDA graph being captured forbids, and it costs tens of microseconds a call on a request path
that reads five tensors. Outputs are allocated in the caller's framework (``tensor.new_empty``
for PyTorch, a CuPy buffer exported through DLPack for JAX, CuPy otherwise -- bfloat16 as
CuPy's bfloat16 where it has one, else raw uint16 bits) and kernels run on the caller's current
stream. The second half of the module turns arrays of any framework into numpy or CuPy for the
host-side entry points (masks, the reference, the emulator).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._array import cupy_or_none, is_cupy, torch_stream_ptr

__all__ = ["DeviceTensor", "from_any", "empty_like_caller", "current_stream_ptr", "device_of",
           "framework_of", "cupy_bfloat16", "as_array"]

_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
_DL_CODES = {(2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (0, 32): "int32",
             (2, 64): "float64", (1, 16): "uint16", (0, 64): "int64", (1, 8): "bool"}
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "float64": 8, "uint16": 2,
             "int64": 8, "bool": 1}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]

_capi = ctypes.pythonapi
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@functools.lru_cache(maxsize=256)  # an output's shape, on every request
def _row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a compact row-major array of ``shape``."""
    return tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))


@dataclass
class DeviceTensor:
    """What a kernel needs of a device array: address, shape, element strides, dtype.

    ``owner`` keeps the producer (and its DLPack capsule) alive while the pointer is in use.
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device_id: int
    framework: str
    owner: Any

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]


def framework_of(x: Any) -> str:
    """'cupy', 'torch', 'jax' or 'dlpack' (another producer), from the object's type."""
    mod = type(x).__module__.split(".")[0]
    if mod in ("cupy", "torch", "jax", "jaxlib"):
        return "jax" if mod == "jaxlib" else mod
    return "dlpack"


def _from_cupy(x: Any) -> DeviceTensor:
    item = x.dtype.itemsize
    name = x.dtype.name
    return DeviceTensor(int(x.data.ptr), tuple(x.shape), tuple(s // item for s in x.strides),
                        name, int(x.device.id), "cupy", x)


def _from_capsule(x: Any, capsule: Any, framework: str, name: str) -> DeviceTensor:
    if not _capi.PyCapsule_IsValid(capsule, b"dltensor"):
        raise TypeError(f"{name}: __dlpack__ did not return a 'dltensor' capsule")
    mt = _DLManagedTensor.from_address(_capi.PyCapsule_GetPointer(capsule, b"dltensor"))
    t = mt.dl_tensor
    if t.device.device_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        raise ValueError(f"{name} must be on a CUDA device (DLPack device type "
                         f"{t.device.device_type})")
    if t.dtype.lanes != 1 or (t.dtype.code, t.dtype.bits) not in _DL_CODES:
        raise TypeError(f"{name}: unsupported DLPack dtype code={t.dtype.code} "
                        f"bits={t.dtype.bits} lanes={t.dtype.lanes}")
    dtype = _DL_CODES[(t.dtype.code, t.dtype.bits)]
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:  # NULL strides mean compact row-major
        strides = _row_major_strides(shape)
    ptr = (t.data or 0) + t.byte_offset
    return DeviceTensor(ptr, shape, strides, dtype, int(t.device.device_id), framework,
                        (x, capsule))


def _from_torch(x: Any, name: str) -> DeviceTensor:
    if x.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got a torch tensor on {x.device}")
    dtype = str(x.dtype).removeprefix("torch.")
    if dtype not in _ITEMSIZE:
        raise TypeError(f"{name}: unsupported dtype {x.dtype}")
    return DeviceTensor(int(x.data_ptr()), tuple(x.shape), tuple(x.stride()), dtype,
                        int(x.device.index), "torch", x)


def from_any(x: Any, name: str, stream_ptr: int | None = None) -> DeviceTensor:
    """Describe a device tensor without copying it; raise TypeError/ValueError naming ``name``.
    ``stream_ptr``: the stream the kernels will run on, which a DLPack producer orders its
    pending work before (PyTorch and CuPy are read directly; their work is on that stream)."""
    fw = framework_of(x)
    cp = cupy_or_none()
    if cp is not None and isinstance(x, cp.ndarray):
        return _from_cupy(x)
    if fw == "torch" and hasattr(x, "data_ptr"):
        return _from_torch(x, name)
    if isinstance(x, np.ndarray):
        raise ValueError(f"{name} is a host (numpy) array; Tessera runs on CUDA device arrays "
                         "(use tessera.reference.attention on the host)")
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"{name} must be a CuPy array or a DLPack tensor, got {type(x).__name__}")
    if hasattr(x, "__dlpack_device__"):
        dev_type = int(x.__dlpack_device__()[0])
        if dev_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
            raise ValueError(f"{name} must be on a CUDA device (DLPack device type {dev_type})")
    try:
        # Asking with our stream makes the producer order its pending work before our launch
        # (DLPack's stream 1 is the legacy default stream, which CUDA calls 0).
        capsule = x.__dlpack__(stream=(stream_ptr or 1) if stream_ptr is not None else None)
    except TypeError:
        capsule = x.__dlpack__()
    return _from_capsule(x, capsule, fw, name)


def device_of(x: Any) -> int:
    """The CUDA device a tensor lives on, read without describing it (0 when unknown)."""
    cp = cupy_or_none()
    if cp is not None and isinstance(x, cp.ndarray):
        return int(x.device.id)
    if framework_of(x) == "torch" and hasattr(x, "device"):
        return int(x.device.index or 0)
    if hasattr(x, "__dlpack_device__"):
        return int(x.__dlpack_device__()[1])
    return 0


def current_stream_ptr(fw: str, device_id: int) -> int:
    """The caller's current CUDA stream (0: the legacy default stream)."""
    if fw == "torch":
        return torch_stream_ptr(device_id)
    cp = cupy_or_none()
    return int(cp.cuda.get_current_stream().ptr) if cp is not None else 0


# ---- exporting CuPy memory as a DLPack tensor of any dtype (bfloat16 for JAX) --------------------
_exported: dict[int, Any] = {}
_exported_lock = threading.Lock()


@_DELETER
def _release(mt_ptr):  # called by the consumer when it no longer needs the memory
    with _exported_lock:
        _exported.pop(ctypes.addressof(mt_ptr.contents), None)


_CAPSULE_DTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CAPSULE_DTOR
def _capsule_dtor(capsule_ptr):
    # An unconsumed capsule still owns the tensor; a consumed one was renamed "used_dltensor".
    cap = ctypes.cast(capsule_ptr, ctypes.py_object)
    if _capi.PyCapsule_IsValid(cap, b"dltensor"):
        ptr = _capi.PyCapsule_GetPointer(cap, b"dltensor")
        with _exported_lock:
            _exported.pop(ptr, None)


class _Exporter:
    """A one-shot DLPack producer for a CuPy buffer viewed with another dtype."""

    def __init__(self, buf: Any, shape: tuple[int, ...], dtype: str, device_id: int):
        self.buf, self.shape, self.dtype, self.device_id = buf, shape, dtype, device_id

    def __dlpack_device__(self):
        return (_KDL_CUDA, self.device_id)

    def __dlpack__(self, stream: Any = None, **_: Any):
        code, bits = next(k for k, v in _DL_CODES.items() if v == self.dtype)
        mt = _DLManagedTensor()
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        strides = (ctypes.c_int64 * len(self.shape))(*_row_major_strides(self.shape))
        mt.dl_tensor = _DLTensor(self.buf.data.ptr, _DLDevice(_KDL_CUDA, self.device_id),
                                 len(self.shape), _DLDataType(code, bits, 1), shape, strides, 0)
        mt.deleter = _release
        addr = ctypes.addressof(mt)
        with _exported_lock:
            _exported[addr] = (mt, shape, strides, self.buf)
        return _capi.PyCapsule_New(addr, b"dltensor", ctypes.cast(_capsule_dtor, ctypes.c_void_p))


def empty_like_caller(template: DeviceTensor, shape: tuple[int, ...], dtype: str
                      ) -> tuple[DeviceTensor, Any]:
    """A new contiguous device tensor for the caller (the framework of ``template``).

    Returns its :class:`DeviceTensor` (for the kernels) and ``finish(stream)``, which hands the
    tensor over as the caller's type once the kernels writing it are enqueued on ``stream``.
    """
    fw = template.framework
    if fw == "torch":
        import torch  # noqa: PLC0415 - the caller's own framework, already imported

        owner = template.owner[0] if isinstance(template.owner, tuple) else template.owner
        obj = owner.new_empty(shape, dtype=getattr(torch, dtype))
        # Described from what we asked for (a new tensor is compact and row-major on the
        # template's device) rather than read back attribute by attribute.
        desc = DeviceTensor(int(obj.data_ptr()), tuple(shape), _row_major_strides(shape), dtype,
                            template.device_id, "torch", obj)
        return desc, lambda stream: obj
    cp = cupy_or_none()
    with cp.cuda.Device(template.device_id):
        n = int(np.prod(shape, dtype=np.int64))
        if dtype == "bfloat16":
            # JAX's exporter needs raw bits; a CuPy caller gets CuPy's bfloat16 where it has one.
            bf16 = None if fw == "jax" else cupy_bfloat16()
            buf = cp.empty(n, dtype=cp.uint16 if bf16 is None else bf16).reshape(shape)
        else:
            buf = cp.empty(n, dtype=dtype).reshape(shape)
    desc = DeviceTensor(int(buf.data.ptr), shape,
                        _row_major_strides(shape),
                        dtype, template.device_id, fw, buf)
    if fw == "jax":
        def finish(stream: Any) -> Any:
            import jax  # noqa: PLC0415 - the caller's own framework, already imported

            stream.synchronize()  # JAX exposes no stream to order against
            return jax.dlpack.from_dlpack(_Exporter(buf, shape, dtype, template.device_id))
        return desc, finish
    # CuPy (and other producers): a CuPy array -- bfloat16 where CuPy has the dtype (CuPy 14
    # with ml_dtypes), else its raw bits as uint16 (view them with ``.view(bfloat16)``).
    return desc, lambda stream: buf


_BF16_UNKNOWN = object()
_bf16: Any = _BF16_UNKNOWN


def cupy_bfloat16() -> Any:
    """The bfloat16 dtype CuPy arrays can hold (``ml_dtypes.bfloat16``, which CuPy 14 supports),
    or None where CuPy or ml_dtypes lacks it; asked once per process."""
    global _bf16
    if _bf16 is _BF16_UNKNOWN:
        _bf16 = None
        cp = cupy_or_none()
        try:
            import ml_dtypes  # noqa: PLC0415 - optional: JAX and CuPy 14's bfloat16 bring it

            dt = np.dtype(ml_dtypes.bfloat16)
            if cp is not None and cp.empty(1, dtype=dt).dtype == dt:
                _bf16 = dt
        except Exception:  # no ml_dtypes, or a CuPy that refuses the dtype
            pass
    return _bf16


# ---- arrays of any framework as numpy or CuPy (masks, the reference, the emulator) -------------
def as_array(a: Any, name: str) -> Any:
    """Turn numpy/CuPy arrays, DLPack tensors (PyTorch, JAX) or sequences into numpy or CuPy.

    Device tensors stay on the device (zero-copy through DLPack); host tensors become numpy.
    """
    if isinstance(a, np.ndarray) or is_cupy(a):
        return a
    if type(a).__module__.startswith("torch") and getattr(a, "is_cuda", False):
        return _cupy_view_of_torch(a, name)
    if hasattr(a, "__dlpack__"):
        device_type = None
        if hasattr(a, "__dlpack_device__"):
            device_type = int(a.__dlpack_device__()[0])
        if device_type in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
            cp = cupy_or_none()
            if cp is None:
                raise TypeError(f"{name} is a CUDA tensor but CuPy is not installed")
            return cp.from_dlpack(a)
        return np.from_dlpack(a)
    try:
        return np.asarray(a)
    except Exception as exc:  # pragma: no cover - message path
        raise TypeError(f"{name} must be an array (numpy, CuPy or a DLPack tensor), "
                        f"got {type(a).__name__}") from exc


def _cupy_view_of_torch(a: Any, name: str) -> Any:
    """A CuPy array over a CUDA torch tensor's memory, no copy, without torch's ``__dlpack__``
    (which costs tens of microseconds on the request path) when torch and CuPy work on the same
    stream, so that CuPy's work on the array is ordered after torch's. Otherwise, and for
    bfloat16 (no CuPy dtype), DLPack, whose stream handshake orders them."""
    cp = cupy_or_none()
    if cp is None:
        raise TypeError(f"{name} is a CUDA tensor but CuPy is not installed")
    with cp.cuda.Device(a.device.index):
        dt = _numpy_dtype_on_cupy_stream(a, cp)
        if dt is None:
            return cp.from_dlpack(a)
        if a.numel() == 0:
            return cp.empty(tuple(a.shape), dtype=dt)
        span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride()))  # elements spanned
        mem = cp.cuda.UnownedMemory(a.data_ptr(), span * dt.itemsize, a, a.device.index)
        return cp.ndarray(tuple(a.shape), dtype=dt, memptr=cp.cuda.MemoryPointer(mem, 0),
                          strides=tuple(s * dt.itemsize for s in a.stride()))


def torch_private_copy(a: Any) -> Any:
    """A CuPy copy of a contiguous CUDA torch tensor of a numpy dtype, made by one
    device-to-device copy on CuPy's current stream of its device when that is torch's current
    stream there (so the copy is ordered after whatever torch wrote into it), without a CuPy
    view of the tensor first (that view costs ~30 us of a request's host time on the H200);
    None when any of that does not hold (the caller then takes the
    general path: a view or DLPack, and private_copy)."""
    cp = cupy_or_none()
    if cp is None or not a.is_contiguous():
        return None
    with cp.cuda.Device(a.device.index):
        dtype = _numpy_dtype_on_cupy_stream(a, cp)
        if dtype is None:
            return None
        out = cp.empty(tuple(a.shape), dtype=dtype)
        if out.nbytes:
            cp.cuda.runtime.memcpyAsync(out.data.ptr, a.data_ptr(), out.nbytes,
                                        cp.cuda.runtime.memcpyDeviceToDevice,
                                        cp.cuda.get_current_stream().ptr)
    return out


def _numpy_dtype_on_cupy_stream(a: Any, cp: Any) -> np.dtype | None:
    """The numpy dtype of a CUDA torch tensor when numpy has one (not bfloat16) and torch's
    current stream on its device is CuPy's (CuPy's work on its memory is then ordered after
    torch's), else None. Called with the tensor's device current (CuPy's current stream is per
    device)."""

    dtype = _numpy_dtype_of_torch(a.dtype)
    if dtype is None or torch_stream_ptr(a.device.index) != cp.cuda.get_current_stream().ptr:
        return None
    return dtype


@functools.lru_cache(maxsize=64)  # a request's mask dtype, every request
def _numpy_dtype_of_torch(torch_dtype: Any) -> np.dtype | None:
    try:
        return np.dtype(str(torch_dtype).removeprefix("torch."))
    except TypeError:  # bfloat16 and other types numpy lacks
        return None
