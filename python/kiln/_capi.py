"""libkiln's C ABI (include/kiln/kiln.h) through ctypes.

Argument blocks are packed with one precompiled `struct.Struct` per operator into one buffer that
holds the argument struct followed by its kiln_tensor descriptors: one pack call per operator
call, which is what keeps the Python layer's overhead to a few microseconds.
"""
import ctypes
import os
import struct
import threading

from ._errors import raise_for_status

MAX_DIMS = 6
# kiln_dtype
BF16, F16, F32, F8_E4M3, F8_E5M2, F4_E2M1X2, E8M0, I32, I64, F4_E2M1X2_PREPARED = range(1, 11)
DTYPE_NAMES = {BF16: "bf16", F16: "f16", F32: "f32", F8_E4M3: "e4m3", F8_E5M2: "e5m2", F4_E2M1X2: "mxfp4 (e2m1x2)",
               E8M0: "e8m0", I32: "int32", I64: "int64", F4_E2M1X2_PREPARED: "mxfp4 prepared"}
HOST_DEVICE = -1

# kiln_tensor: data, dtype, ndim, shape[6], strides[6], device (+4 bytes of padding: 120 bytes).
TENSOR_FORMAT = "Pii6q6qi4x"
TENSOR_FIELDS = 16
NO_TENSOR = (0, 0, 0) + (0,) * 12 + (0,)


def _library_path():
    override = os.environ.get("KILN_LIBRARY")
    if override:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "lib", "libkiln.so")


def _load():
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"kiln: cannot load libkiln from {path}: {e} (set KILN_LIBRARY to another libkiln.so)") from e
    c = ctypes
    sigs = {
        "kiln_last_error": (c.c_char_p, []),
        "kiln_version": (c.c_char_p, []),
        "kiln_mha_prefill": (c.c_int, [c.c_void_p, c.c_void_p]),
        "kiln_mha_decode_with_kvcache": (c.c_int, [c.c_void_p, c.c_void_p]),
        "kiln_mha_extend_with_kvcache": (c.c_int, [c.c_void_p, c.c_void_p]),
        "kiln_kv_cache_append": (c.c_int, [c.c_void_p, c.c_void_p]),
        "kiln_moe_apply": (c.c_int, [c.c_void_p, c.c_void_p]),
        "kiln_moe_prepare_weights": (c.c_int, [c.c_void_p, c.c_void_p]),
        "kiln_list_kernels_json": (c.c_int, [c.POINTER(c.c_void_p)]),
        "kiln_explain_json": (c.c_int, [c.c_char_p, c.c_char_p, c.c_char_p, c.POINTER(c.c_void_p)]),
        "kiln_set_override": (c.c_int, [c.c_char_p, c.c_char_p]),
        "kiln_load_plugin": (c.c_int, [c.c_char_p]),
        "kiln_free_string": (None, [c.c_void_p]),
        "kiln_set_scratch_allocator": (c.c_int, [c.c_void_p, c.c_void_p, c.c_void_p]),
        "kiln_prepare_only": (c.c_int, [c.c_int32]),
        "kiln_set_log_callback": (c.c_int, [c.c_void_p, c.c_void_p]),
        "kiln_set_log_level": (c.c_int, [c.c_int32]),
        "kiln_set_jit": (c.c_int, [c.c_int32]),
        "kiln_cache_stats_json": (c.c_int, [c.POINTER(c.c_void_p)]),
        "kiln_warmup_json": (c.c_int, [c.c_char_p, c.c_char_p, c.c_int32, c.POINTER(c.c_void_p)]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()


def last_error():
    return lib.kiln_last_error().decode("utf-8", "replace")


def check(status):
    if status != 0:
        raise_for_status(status, last_error())


def call_json(fn, *args):
    """Calls a kiln_*_json function and returns the string it allocated."""
    out = ctypes.c_void_p()
    check(fn(*args, ctypes.byref(out)))
    try:
        return ctypes.string_at(out.value).decode("utf-8")
    finally:
        lib.kiln_free_string(out)


def encode(text):
    return None if text is None else str(text).encode("utf-8")


# Callback types of kiln.h.
SCRATCH_ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
SCRATCH_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p)


class ArgBlock:
    """The layout of one operator's argument struct followed by its tensor descriptors.

    `fields` lists the struct's members in order as (name, kind) with kind "tensor" (a pointer to
    a kiln_tensor, NULL when absent), "i32" or "f32". `pack(values)` takes, per field, a
    16-tuple descriptor or None for tensors and a number otherwise; `pack_torch(values, dtypes)`
    takes torch tensors (or None) directly, the fast path of kiln.torch. Both return a buffer
    whose address is the argument struct's, valid until the thread's next call of this block.
    """

    _CODES = {"tensor": "P", "i32": "i", "f32": "f"}

    def __init__(self, fields):
        self.fields = fields
        self.tensor_slots = tuple(i for i, (_, kind) in enumerate(fields) if kind == "tensor")
        head = "@" + "".join(self._CODES[kind] for _, kind in fields)
        self.head_size = struct.calcsize(head)
        align = struct.calcsize("@P")
        self.tensor_base = (self.head_size + align - 1) // align * align
        self.tensor_size = struct.calcsize("@" + TENSOR_FORMAT)
        pad = self.tensor_base - self.head_size
        fmt = head + (f"{pad}x" if pad else "") + TENSOR_FORMAT * len(self.tensor_slots)
        self.struct = struct.Struct(fmt)
        assert self.struct.size == self.tensor_base + self.tensor_size * len(self.tensor_slots)
        self._local = threading.local()

    def index(self, name):
        return [field for field, _ in self.fields].index(name)

    def _buffer(self):
        # One buffer per thread, reused: kiln reads the block only during the call it is passed to,
        # and no kiln call runs inside another on one thread (callbacks must not call kiln).
        local = self._local
        try:
            return local.buf, local.slots
        except AttributeError:
            local.buf = ctypes.create_string_buffer(self.struct.size)
            base = ctypes.addressof(local.buf)
            local.slots = tuple(base + self.tensor_base + n * self.tensor_size for n in range(len(self.tensor_slots)))
            return local.buf, local.slots

    def pack(self, values):
        buf, slots = self._buffer()
        head = list(values)
        tail = []
        for n, i in enumerate(self.tensor_slots):
            d = values[i]
            if d is None:
                head[i] = 0
                tail.extend(NO_TENSOR)
            else:
                head[i] = slots[n]
                tail.extend(d)
        self.struct.pack_into(buf, 0, *head, *tail)
        return buf

    def pack_torch(self, values, dtypes, forced=None):
        """values: torch tensors (or None) in tensor fields; dtypes: torch dtype -> kiln dtype;
        forced: {field index: kiln dtype} for byte formats. Returns the buffer, or the name of the
        first tensor whose dtype kiln has no equivalent for (the caller raises)."""
        buf, slots = self._buffer()
        head = list(values)
        tail = []
        n = 0
        for i in self.tensor_slots:
            t = values[i]
            if t is None:
                head[i] = 0
                tail += NO_TENSOR
            else:
                head[i] = slots[n]
                shape = t.shape
                pad = _PADS[len(shape)] if len(shape) <= MAX_DIMS else None
                if pad is None:
                    return self.fields[i][0]
                code = forced[i] if forced and i in forced else dtypes.get(t.dtype)
                if code is None:
                    return self.fields[i][0]
                tail += (t.data_ptr(), code, len(shape), *shape, *pad, *t.stride(), *pad, t.get_device())
            n += 1
        self.struct.pack_into(buf, 0, *head, *tail)
        return buf


_PADS = tuple((0,) * (MAX_DIMS - n) for n in range(MAX_DIMS + 1))


PREFILL_ARGS = ArgBlock([("q", "tensor"), ("k", "tensor"), ("v", "tensor"), ("out", "tensor"), ("cu_seqlens_q", "tensor"),
                         ("cu_seqlens_k", "tensor"), ("max_seqlen_q", "i32"), ("max_seqlen_k", "i32"), ("lse", "tensor"),
                         ("sinks", "tensor"), ("softmax_scale", "f32"), ("softcap", "f32"), ("causal", "i32"),
                         ("window_left", "i32")])
DECODE_ARGS = ArgBlock([("q", "tensor"), ("k_cache", "tensor"), ("v_cache", "tensor"), ("page_table", "tensor"),
                        ("cache_seqlens", "tensor"), ("out", "tensor"), ("q_len", "i32"), ("lse", "tensor"), ("sinks", "tensor"),
                        ("softmax_scale", "f32"), ("softcap", "f32"), ("window_left", "i32"), ("k_scale", "f32"),
                        ("v_scale", "f32")])
EXTEND_ARGS = ArgBlock([("q", "tensor"), ("k_cache", "tensor"), ("v_cache", "tensor"), ("page_table", "tensor"),
                        ("cache_seqlens", "tensor"), ("cu_seqlens_q", "tensor"), ("out", "tensor"), ("max_seqlen_q", "i32"),
                        ("lse", "tensor"), ("sinks", "tensor"), ("softmax_scale", "f32"), ("softcap", "f32"), ("causal", "i32"),
                        ("window_left", "i32"), ("k_scale", "f32"), ("v_scale", "f32")])
APPEND_ARGS = ArgBlock([("k", "tensor"), ("v", "tensor"), ("slot_mapping", "tensor"), ("k_cache", "tensor"), ("v_cache", "tensor"),
                        ("k_scale", "f32"), ("v_scale", "f32")])
MOE_ARGS = ArgBlock([("x", "tensor"), ("out", "tensor"), ("router_logits", "tensor"), ("topk_ids", "tensor"),
                     ("topk_weights", "tensor"), ("top_k", "i32"), ("routing", "i32"), ("renormalize", "i32"), ("w13", "tensor"),
                     ("w13_scale", "tensor"), ("w13_bias", "tensor"), ("w2", "tensor"), ("w2_scale", "tensor"),
                     ("w2_bias", "tensor"), ("activation", "i32"), ("gate_up_layout", "i32"),
                     ("activation_dtype", "i32")])
SINGLE_TENSOR = ArgBlock([("weights", "tensor")])


def descriptor(data, dtype, shape, strides, device):
    """A kiln_tensor as the 16 values TENSOR_FORMAT packs. kiln refuses ndim outside 1..6 itself,
    naming the argument, so a descriptor is made for any rank."""
    nd = len(shape)
    if nd > MAX_DIMS:
        shape, strides = shape[:MAX_DIMS], strides[:MAX_DIMS]
    pad = (0,) * (MAX_DIMS - len(shape))
    return (data, dtype, nd, *shape, *pad, *strides, *pad, device)


def address(buf, offset=0):
    return ctypes.addressof(buf) + offset
