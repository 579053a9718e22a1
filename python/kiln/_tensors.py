"""Any array that speaks DLPack, __cuda_array_interface__ or __array_interface__ as a kiln_tensor.

torch tensors take a direct path (no DLPack capsule per call). Raw uint8 memory that holds MXFP4
codes or e8m0 scales, which no array protocol can name, is marked with `kiln.typed(array, dtype)`.
"""
import ctypes
import sys

from . import _capi
from ._capi import BF16, E8M0, F4_E2M1X2, F4_E2M1X2_PREPARED, F8_E4M3, F8_E5M2, F16, F32, HOST_DEVICE, I32, I64
from ._errors import invalid_argument

KILN_DTYPE_NAMES = {"bf16": BF16, "f16": F16, "f32": F32, "e4m3": F8_E4M3, "e5m2": F8_E5M2, "mxfp4": F4_E2M1X2,
                    "mxfp4_prepared": F4_E2M1X2_PREPARED, "e8m0": E8M0, "int32": I32, "int64": I64}


class Typed:
    """An array whose bytes kiln should read as `dtype` (a kiln dtype name, e.g. "mxfp4")."""

    __slots__ = ("array", "dtype")

    def __init__(self, array, dtype):
        if dtype not in KILN_DTYPE_NAMES:
            raise invalid_argument(f"dtype: '{dtype}' is not a kiln dtype; expected one of {', '.join(KILN_DTYPE_NAMES)}")
        self.array = array
        self.dtype = KILN_DTYPE_NAMES[dtype]


def typed(array, dtype):
    return Typed(array, dtype)


# Formats that arrays carry as raw bytes.
_BYTE_FORMATS = {F4_E2M1X2, F4_E2M1X2_PREPARED, E8M0}


# ---- torch ---------------------------------------------------------------------------------------
_TORCH_DTYPES = {}


def _torch_dtypes(torch):
    if not _TORCH_DTYPES:
        table = {"bfloat16": BF16, "float16": F16, "float32": F32, "float8_e4m3fn": F8_E4M3, "float8_e5m2": F8_E5M2,
                 "int32": I32, "int64": I64, "float8_e8m0fnu": E8M0}
        for name, code in table.items():
            if hasattr(torch, name):
                _TORCH_DTYPES[getattr(torch, name)] = code
    return _TORCH_DTYPES


def torch_descriptor(t, name, dtype=None):
    """The descriptor of a torch tensor (None passes through as an absent tensor)."""
    if t is None:
        return None
    torch = sys.modules["torch"]
    if dtype is None:
        dtype = _torch_dtypes(torch).get(t.dtype)
        if dtype is None:
            raise invalid_argument(f"{name}: torch dtype {t.dtype} has no kiln equivalent")
    else:
        require_bytes(t, name, dtype)
    device = t.get_device()  # -1 for CPU tensors: host memory
    return _capi.descriptor(t.data_ptr(), dtype, t.shape, t.stride(), device)


def require_bytes(t, name, dtype):
    """A torch tensor read as a byte format (MXFP4 codes, e8m0 scales) must hold bytes."""
    if dtype in _BYTE_FORMATS and t is not None:
        torch = sys.modules["torch"]
        if t.dtype != torch.uint8 and _torch_dtypes(torch).get(t.dtype) != dtype:
            raise invalid_argument(f"{name}: {_capi.DTYPE_NAMES[dtype]} data must be a torch.uint8 tensor of its bytes, got {t.dtype}")


def _is_torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


# ---- DLPack ----------------------------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# DLDeviceType: CPU 1, CUDA 2, CUDAHost 3, ROCM 10, ROCMHost 11, CUDAManaged 13.
_DL_HOST = {1, 3, 11}
_DL_GPU = {2, 10, 13}
# (DLDataTypeCode, bits) -> kiln dtype. Codes: int 0, float 2, bfloat 4, float8_e4m3fn 10,
# float8_e5m2 12, float8_e8m0fnu 14.
_DL_DTYPES = {(4, 16): BF16, (2, 16): F16, (2, 32): F32, (0, 32): I32, (0, 64): I64, (10, 8): F8_E4M3, (12, 8): F8_E5M2,
              (14, 8): E8M0}


def _dlpack_descriptor(obj, name, dtype, stream):
    try:
        capsule = obj.__dlpack__(stream=stream if stream else None)
    except TypeError:
        capsule = obj.__dlpack__()
    address = _capsule_pointer(capsule, b"dltensor")
    t = _DLTensor.from_address(address)  # DLManagedTensor starts with its DLTensor
    nd = t.ndim
    shape = tuple(t.shape[i] for i in range(nd))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(nd))
    else:
        strides, step = [0] * nd, 1
        for i in reversed(range(nd)):
            strides[i], step = step, step * shape[i]
        strides = tuple(strides)
    if t.dtype.lanes != 1:
        raise invalid_argument(f"{name}: DLPack dtype with {t.dtype.lanes} lanes; kiln reads scalar elements")
    if dtype is None:
        dtype = _DL_DTYPES.get((t.dtype.code, t.dtype.bits))
        if dtype is None:
            raise invalid_argument(f"{name}: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits) has no kiln equivalent; "
                                   "mark raw bytes with kiln.typed(array, 'mxfp4' | 'e8m0' | ...)")
    if t.device.device_type in _DL_HOST:
        device = HOST_DEVICE
    elif t.device.device_type in _DL_GPU:
        device = t.device.device_id
    else:
        raise invalid_argument(f"{name}: DLPack device type {t.device.device_type} is neither host nor GPU memory")
    data = (t.data or 0) + t.byte_offset
    return _capi.descriptor(data, dtype, shape, strides, device), capsule


# ---- __cuda_array_interface__ / __array_interface__ ------------------------------------------------
_TYPESTR = {"<f2": F16, "<f4": F32, "<i4": I32, "<i8": I64}


def _interface_descriptor(obj, name, dtype, interface, device):
    shape = tuple(interface["shape"])
    typestr = interface["typestr"]
    itemsize = int(typestr[2:])
    if dtype is None:
        dtype = _TYPESTR.get(typestr)
        if dtype is None:
            raise invalid_argument(f"{name}: array typestr '{typestr}' has no kiln equivalent; "
                                   "mark raw bytes or bf16 with kiln.typed(array, 'bf16' | 'mxfp4' | ...)")
    byte_strides = interface.get("strides")
    if byte_strides is None:
        strides, step = [0] * len(shape), 1
        for i in reversed(range(len(shape))):
            strides[i], step = step, step * shape[i]
    else:
        if any(s % itemsize for s in byte_strides):
            raise invalid_argument(f"{name}: strides {tuple(byte_strides)} are not whole elements of {itemsize} bytes")
        strides = [s // itemsize for s in byte_strides]
    data = interface["data"][0] or 0
    if device is None:  # __cuda_array_interface__: the pointer's device
        device = _pointer_device(data)
    return _capi.descriptor(data, dtype, shape, tuple(strides), device), obj


def _pointer_device(address):
    # __cuda_array_interface__ names no device: the memory is taken to be the current device's
    # (torch's current device when torch is loaded, else device 0); kiln checks that every
    # tensor of a call agrees.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def descriptor(obj, name, dtype=None, stream=0):
    """(descriptor, keep-alive) for any supported array; (None, None) for None."""
    if obj is None:
        return None, None
    if isinstance(obj, Typed):
        return descriptor(obj.array, name, obj.dtype, stream)
    if _is_torch_tensor(obj):
        return torch_descriptor(obj, name, dtype), obj
    if hasattr(obj, "__dlpack__"):
        return _dlpack_descriptor(obj, name, dtype, stream)
    if hasattr(obj, "__cuda_array_interface__"):
        return _interface_descriptor(obj, name, dtype, obj.__cuda_array_interface__, None)
    if hasattr(obj, "__array_interface__"):
        return _interface_descriptor(obj, name, dtype, obj.__array_interface__, HOST_DEVICE)
    raise invalid_argument(f"{name}: a {type(obj).__name__} is no array kiln can read: expected an object with __dlpack__, "
                           "__cuda_array_interface__ or __array_interface__")
