"""The operators over any array type (DLPack, __cuda_array_interface__, __array_interface__).

Keyword arguments mirror the C++ argument structs (include/kiln/ops.hpp). Options that C++
spells with a sentinel (softmax_scale <= 0, window_left = -1, ...) are None here when unset, and
an explicit out-of-range value is an error rather than a silent default.
"""
from . import _capi
from ._errors import invalid_argument
from ._tensors import KILN_DTYPE_NAMES, descriptor

ROUTINGS = {"topk_softmax": 0, "softmax_topk": 1}
ACTIVATIONS = {"silu_glu": 0, "swiglu_clamped": 1}
GATE_UP_LAYOUTS = {"concatenated": 0, "interleaved": 1}
# W4A8: "e4m3" quantizes moe_apply's activations to MXFP8 inside the kernel (MXFP4 weights only).
ACTIVATION_DTYPES = {"bf16": KILN_DTYPE_NAMES["bf16"], "e4m3": KILN_DTYPE_NAMES["e4m3"]}
WEIGHT_FORMATS = ("auto", "mxfp4", "mxfp4_prepared")


def positive(value, name, unset, meaning):
    """A float option that must be > 0 when given; `unset` (the C ABI's spelling) when None."""
    if value is None:
        return unset
    if not float(value) > 0:
        raise invalid_argument(f"{name}: must be > 0, got {value} (None: {meaning})")
    return float(value)


def attention_scalars(softmax_scale, softcap, window_left):
    """(softmax_scale, softcap, window_left) as the C ABI spells them."""
    if window_left is None:
        window = -1
    elif int(window_left) < 0:
        raise invalid_argument(f"window_left: must be >= 0, got {window_left} (None: no window)")
    else:
        window = int(window_left)
    return (positive(softmax_scale, "softmax_scale", 0.0, "1/sqrt(head_dim)"), positive(softcap, "softcap", 0.0, "no softcap"),
            window)


def kv_scale(value, name):
    return positive(value, name, 1.0, "1, for an e4m3 cache only")


def choice(table, value, name):
    if value not in table:
        raise invalid_argument(f"{name}: '{value}' is not one of {', '.join(table)}")
    return table[value]


def moe_weight_dtypes(weight_format):
    """(weights dtype, scales dtype) to force for a weight format; (None, None) reads them as given."""
    if weight_format == "auto":
        return None, None
    if weight_format == "mxfp4":
        return KILN_DTYPE_NAMES["mxfp4"], KILN_DTYPE_NAMES["e8m0"]
    if weight_format == "mxfp4_prepared":
        return KILN_DTYPE_NAMES["mxfp4_prepared"], KILN_DTYPE_NAMES["e8m0"]
    raise invalid_argument(f"weight_format: '{weight_format}' is not one of {', '.join(WEIGHT_FORMATS)}")


def stream_handle(stream):
    """A raw CUstream / hipStream_t from None (the default stream), an int, or a stream object
    (__cuda_stream__, .cuda_stream as torch's, .ptr as CuPy's)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attribute in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attribute):
            return int(getattr(stream, attribute))
    raise invalid_argument(f"stream: a {type(stream).__name__} is no stream kiln can read (an int handle, or an object "
                           "with __cuda_stream__, .cuda_stream or .ptr)")


class _Descriptors:
    """Descriptors of named arrays, holding what keeps their memory alive until the call returns."""

    def __init__(self, stream):
        self.stream = stream
        self.keep = []

    def __call__(self, obj, name, dtype=None):
        d, keep = descriptor(obj, name, dtype, self.stream)
        self.keep.append(keep)
        return d


def mha_prefill(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, lse=None, sinks=None,
                softmax_scale=None, softcap=None, causal=False, window_left=None, stream=None):
    """Attention over packed variable-length sequences; writes `out` (and `lse` when given)."""
    s = stream_handle(stream)
    t = _Descriptors(s)
    scale, cap, window = attention_scalars(softmax_scale, softcap, window_left)
    buf = _capi.PREFILL_ARGS.pack((t(q, "q"), t(k, "k"), t(v, "v"), t(out, "out"), t(cu_seqlens_q, "cu_seqlens_q"),
                                   t(cu_seqlens_k, "cu_seqlens_k"), int(max_seqlen_q), int(max_seqlen_k), t(lse, "lse"),
                                   t(sinks, "sinks"), scale, cap, int(bool(causal)), window))
    _capi.check(_capi.lib.kiln_mha_prefill(buf, s))


def mha_decode_with_kvcache(q, k_cache, v_cache, page_table, cache_seqlens, out, *, q_len=1, lse=None, sinks=None,
                            softmax_scale=None, softcap=None, window_left=None, k_scale=None, v_scale=None, stream=None):
    """Attention of q_len new tokens per sequence against a paged KV cache; writes `out`."""
    s = stream_handle(stream)
    t = _Descriptors(s)
    scale, cap, window = attention_scalars(softmax_scale, softcap, window_left)
    buf = _capi.DECODE_ARGS.pack((t(q, "q"), t(k_cache, "k_cache"), t(v_cache, "v_cache"), t(page_table, "page_table"),
                                  t(cache_seqlens, "cache_seqlens"), t(out, "out"), int(q_len), t(lse, "lse"), t(sinks, "sinks"),
                                  scale, cap, window, kv_scale(k_scale, "k_scale"), kv_scale(v_scale, "v_scale")))
    _capi.check(_capi.lib.kiln_mha_decode_with_kvcache(buf, s))


def mha_extend_with_kvcache(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, out, *, lse=None,
                            sinks=None, softmax_scale=None, softcap=None, causal=True, window_left=None, k_scale=None,
                            v_scale=None, stream=None):
    """Attention of each sequence's new tokens (packed by cu_seqlens_q) against its prefix and
    themselves in a paged KV cache; writes `out`."""
    s = stream_handle(stream)
    t = _Descriptors(s)
    scale, cap, window = attention_scalars(softmax_scale, softcap, window_left)
    buf = _capi.EXTEND_ARGS.pack((t(q, "q"), t(k_cache, "k_cache"), t(v_cache, "v_cache"), t(page_table, "page_table"),
                                  t(cache_seqlens, "cache_seqlens"), t(cu_seqlens_q, "cu_seqlens_q"), t(out, "out"),
                                  int(max_seqlen_q), t(lse, "lse"), t(sinks, "sinks"), scale, cap, int(bool(causal)), window,
                                  kv_scale(k_scale, "k_scale"), kv_scale(v_scale, "v_scale")))
    _capi.check(_capi.lib.kiln_mha_extend_with_kvcache(buf, s))


def kv_cache_append(k, v, slot_mapping, k_cache, v_cache, *, k_scale=None, v_scale=None, stream=None):
    """Writes new tokens' keys and values into the paged caches at slot_mapping (int64; negative
    skips a token); an e4m3 cache stores value / scale."""
    s = stream_handle(stream)
    t = _Descriptors(s)
    buf = _capi.APPEND_ARGS.pack((t(k, "k"), t(v, "v"), t(slot_mapping, "slot_mapping"), t(k_cache, "k_cache"),
                                  t(v_cache, "v_cache"), kv_scale(k_scale, "k_scale"), kv_scale(v_scale, "v_scale")))
    _capi.check(_capi.lib.kiln_kv_cache_append(buf, s))


def moe_apply(x, out, w13, w2, *, top_k, router_logits=None, topk_ids=None, topk_weights=None, routing="topk_softmax",
              renormalize=True, w13_scale=None, w13_bias=None, w2_scale=None, w2_bias=None, activation="silu_glu",
              gate_up_layout="concatenated", weight_format="auto", activation_dtype="bf16", stream=None):
    """Mixture of experts; writes `out`. weight_format "mxfp4" or "mxfp4_prepared" reads uint8
    w13/w2 as packed e2m1 pairs and their scales as e8m0; activation_dtype "e4m3" with them is W4A8."""
    s = stream_handle(stream)
    t = _Descriptors(s)
    wdt, sdt = moe_weight_dtypes(weight_format)
    buf = _capi.MOE_ARGS.pack((t(x, "x"), t(out, "out"), t(router_logits, "router_logits"), t(topk_ids, "topk_ids"),
                               t(topk_weights, "topk_weights"), int(top_k), choice(ROUTINGS, routing, "routing"),
                               int(bool(renormalize)), t(w13, "w13", wdt), t(w13_scale, "w13_scale", sdt),
                               t(w13_bias, "w13_bias"), t(w2, "w2", wdt), t(w2_scale, "w2_scale", sdt), t(w2_bias, "w2_bias"),
                               choice(ACTIVATIONS, activation, "activation"),
                               choice(GATE_UP_LAYOUTS, gate_up_layout, "gate_up_layout"),
                               choice(ACTIVATION_DTYPES, activation_dtype, "activation_dtype")))
    _capi.check(_capi.lib.kiln_moe_apply(buf, s))


def moe_prepare_weights(weights, stream=None):
    """Rewrites MXFP4 weights (uint8 w13 or w2 of moe_apply) in place into kiln's prepared order;
    pass them afterwards with weight_format="mxfp4_prepared". Finished when it returns."""
    s = stream_handle(stream)
    t = _Descriptors(s)
    buf = _capi.SINGLE_TENSOR.pack((t(weights, "weights", KILN_DTYPE_NAMES["mxfp4"]),))
    # kiln_moe_prepare_weights takes the descriptor itself, which is the block's only tensor.
    _capi.check(_capi.lib.kiln_moe_prepare_weights(_capi.address(buf, _capi.SINGLE_TENSOR.tensor_base), s))
