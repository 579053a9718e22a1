"""kiln's operators as PyTorch operators: torch.ops.kiln.*.

Importing this module registers them through torch.library (no compiled torch extension: one
wheel serves every torch from 2.4 on) and routes kiln's scratch memory through torch's caching
allocator, so calls capture in CUDA graphs and their memory is accounted where torch accounts it.

Operators (schemas below; tensors on one CUDA device; the current torch stream):
  mha_prefill, mha_prefill_lse, mha_prefill_out
  mha_decode_with_kvcache, mha_decode_with_kvcache_lse, mha_decode_with_kvcache_out
  mha_extend_with_kvcache, mha_extend_with_kvcache_lse, mha_extend_with_kvcache_out
  kv_cache_append (writes the caches in place)
  moe_apply, moe_apply_out, moe_prepare_weights
The functional forms allocate their outputs; the *_out forms write the caller's `out` (and `lse`)
and return nothing. Every one has a fake implementation, so torch.compile(fullgraph=True) traces
them without a graph break. kiln's errors arrive as kiln.KilnError subclasses.

CUDA graphs: a call whose kernel is not yet loaded cannot be captured (it would compile or load):
run a step once eagerly, or under warmup_for(step, ...), before capturing it.
"""
import torch as _torch

from . import _capi, _ops, prepare_only
from ._errors import invalid_argument
from ._tensors import _torch_dtypes, require_bytes

__all__ = ["mha_prefill", "mha_decode_with_kvcache", "mha_extend_with_kvcache", "kv_cache_append", "moe_apply", "moe_prepare_weights", "warmup_for"]

_ATTENTION_OPTIONS = "float? softmax_scale=None, float? softcap=None, int? window_left=None"
_PREFILL_INPUTS = "Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k"
_PREFILL_OPTIONS = f"Tensor? sinks=None, {_ATTENTION_OPTIONS}, bool causal=False"
_DECODE_INPUTS = "Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor cache_seqlens"
_DECODE_OPTIONS = f"int q_len=1, Tensor? sinks=None, {_ATTENTION_OPTIONS}, float? k_scale=None, float? v_scale=None"
_EXTEND_INPUTS = ("Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor cache_seqlens, Tensor cu_seqlens_q, "
                  "int max_seqlen_q")
_EXTEND_OPTIONS = f"Tensor? sinks=None, {_ATTENTION_OPTIONS}, bool causal=True, float? k_scale=None, float? v_scale=None"
_MOE_INPUTS = "Tensor x, Tensor w13, Tensor w2, int top_k"
_MOE_OPTIONS = ("Tensor? router_logits=None, Tensor? topk_ids=None, Tensor? topk_weights=None, str routing='topk_softmax', "
                "bool renormalize=True, Tensor? w13_scale=None, Tensor? w13_bias=None, Tensor? w2_scale=None, "
                "Tensor? w2_bias=None, str activation='silu_glu', str gate_up_layout='concatenated', str weight_format='auto', "
                "str activation_dtype='bf16'")

_SCHEMAS = {
    "mha_prefill": f"({_PREFILL_INPUTS}, *, {_PREFILL_OPTIONS}) -> Tensor",
    "mha_prefill_lse": f"({_PREFILL_INPUTS}, *, {_PREFILL_OPTIONS}) -> (Tensor, Tensor)",
    "mha_prefill_out": f"({_PREFILL_INPUTS}, *, Tensor(a!) out, Tensor(b!)? lse=None, {_PREFILL_OPTIONS}) -> ()",
    "mha_decode_with_kvcache": f"({_DECODE_INPUTS}, *, {_DECODE_OPTIONS}) -> Tensor",
    "mha_decode_with_kvcache_lse": f"({_DECODE_INPUTS}, *, {_DECODE_OPTIONS}) -> (Tensor, Tensor)",
    "mha_decode_with_kvcache_out": f"({_DECODE_INPUTS}, *, Tensor(a!) out, Tensor(b!)? lse=None, {_DECODE_OPTIONS}) -> ()",
    "mha_extend_with_kvcache": f"({_EXTEND_INPUTS}, *, {_EXTEND_OPTIONS}) -> Tensor",
    "mha_extend_with_kvcache_lse": f"({_EXTEND_INPUTS}, *, {_EXTEND_OPTIONS}) -> (Tensor, Tensor)",
    "mha_extend_with_kvcache_out": f"({_EXTEND_INPUTS}, *, Tensor(a!) out, Tensor(b!)? lse=None, {_EXTEND_OPTIONS}) -> ()",
    "kv_cache_append": ("(Tensor k, Tensor v, Tensor slot_mapping, Tensor(a!) k_cache, Tensor(b!) v_cache, *, float? k_scale=None, "
                        "float? v_scale=None) -> ()"),
    "moe_apply": f"({_MOE_INPUTS}, *, {_MOE_OPTIONS}) -> Tensor",
    "moe_apply_out": f"({_MOE_INPUTS}, *, Tensor(a!) out, {_MOE_OPTIONS}) -> ()",
    "moe_prepare_weights": "(Tensor(a!) weights) -> ()",
}

_library = _torch.library.Library("kiln", "DEF")
for _name, _schema in _SCHEMAS.items():
    _library.define(_name + _schema)

_raw_stream = getattr(_torch._C, "_cuda_getCurrentRawStream", None)


def _stream(t):
    device = t.get_device()
    if device < 0:
        return 0  # host tensors: kiln refuses them by name before any stream is used
    if _raw_stream is not None:
        return _raw_stream(device)
    return _torch.cuda.current_stream(device).cuda_stream


# ---- eager implementations ----------------------------------------------------------------------
_DTYPES = _torch_dtypes(_torch)


def _packed(block, values, forced=None):
    buf = block.pack_torch(values, _DTYPES, forced)
    if isinstance(buf, str):  # the field pack_torch could not describe
        t = values[[name for name, _ in block.fields].index(buf)]
        if t.dim() > _capi.MAX_DIMS:
            raise invalid_argument(f"{buf}: rank {t.dim()} exceeds kiln's {_capi.MAX_DIMS}")
        raise invalid_argument(f"{buf}: torch dtype {t.dtype} has no kiln equivalent")
    return buf


def _prefill_out(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, out, lse=None, sinks=None,
                 softmax_scale=None, softcap=None, window_left=None, causal=False):
    scale, cap, window = _ops.attention_scalars(softmax_scale, softcap, window_left)
    buf = _packed(_capi.PREFILL_ARGS, (q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, lse, sinks, scale, cap,
                                       int(causal), window))
    _capi.check(_capi.lib.kiln_mha_prefill(buf, _stream(q)))


def _decode_out(q, k_cache, v_cache, page_table, cache_seqlens, *, out, lse=None, q_len=1, sinks=None, softmax_scale=None,
                softcap=None, window_left=None, k_scale=None, v_scale=None):
    scale, cap, window = _ops.attention_scalars(softmax_scale, softcap, window_left)
    buf = _packed(_capi.DECODE_ARGS, (q, k_cache, v_cache, page_table, cache_seqlens, out, q_len, lse, sinks, scale, cap, window,
                                      _ops.kv_scale(k_scale, "k_scale"), _ops.kv_scale(v_scale, "v_scale")))
    _capi.check(_capi.lib.kiln_mha_decode_with_kvcache(buf, _stream(q)))


def _extend_out(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, *, out, lse=None, sinks=None,
                softmax_scale=None, softcap=None, window_left=None, causal=True, k_scale=None, v_scale=None):
    scale, cap, window = _ops.attention_scalars(softmax_scale, softcap, window_left)
    buf = _packed(_capi.EXTEND_ARGS, (q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, out, max_seqlen_q, lse, sinks,
                                      scale, cap, int(causal), window, _ops.kv_scale(k_scale, "k_scale"),
                                      _ops.kv_scale(v_scale, "v_scale")))
    _capi.check(_capi.lib.kiln_mha_extend_with_kvcache(buf, _stream(q)))


def _append(k, v, slot_mapping, k_cache, v_cache, *, k_scale=None, v_scale=None):
    buf = _packed(_capi.APPEND_ARGS, (k, v, slot_mapping, k_cache, v_cache, _ops.kv_scale(k_scale, "k_scale"),
                                      _ops.kv_scale(v_scale, "v_scale")))
    _capi.check(_capi.lib.kiln_kv_cache_append(buf, _stream(k)))


_W13, _W13_SCALE, _W2, _W2_SCALE = (_capi.MOE_ARGS.index(n) for n in ("w13", "w13_scale", "w2", "w2_scale"))


def _moe_out(x, w13, w2, top_k, *, out, router_logits=None, topk_ids=None, topk_weights=None, routing="topk_softmax",
             renormalize=True, w13_scale=None, w13_bias=None, w2_scale=None, w2_bias=None, activation="silu_glu",
             gate_up_layout="concatenated", weight_format="auto", activation_dtype="bf16"):
    forced = None
    codes, scales = _ops.moe_weight_dtypes(weight_format)
    if codes is not None:
        for t, name, dtype in ((w13, "w13", codes), (w2, "w2", codes), (w13_scale, "w13_scale", scales), (w2_scale, "w2_scale", scales)):
            require_bytes(t, name, dtype)
        forced = {_W13: codes, _W13_SCALE: scales, _W2: codes, _W2_SCALE: scales}
    buf = _packed(_capi.MOE_ARGS, (x, out, router_logits, topk_ids, topk_weights, top_k,
                                   _ops.choice(_ops.ROUTINGS, routing, "routing"), int(renormalize), w13, w13_scale, w13_bias, w2,
                                   w2_scale, w2_bias, _ops.choice(_ops.ACTIVATIONS, activation, "activation"),
                                   _ops.choice(_ops.GATE_UP_LAYOUTS, gate_up_layout, "gate_up_layout"),
                                   _ops.choice(_ops.ACTIVATION_DTYPES, activation_dtype, "activation_dtype")), forced)
    _capi.check(_capi.lib.kiln_moe_apply(buf, _stream(x)))


def _lse_like(q):
    return q.new_empty((q.shape[0], q.shape[1]), dtype=_torch.float32)


def _prefill(*args, **kwargs):
    out = args[0].new_empty(args[0].shape)
    _prefill_out(*args, out=out, **kwargs)
    return out


def _prefill_lse(*args, **kwargs):
    out, lse = args[0].new_empty(args[0].shape), _lse_like(args[0])
    _prefill_out(*args, out=out, lse=lse, **kwargs)
    return out, lse


def _decode(*args, **kwargs):
    out = args[0].new_empty(args[0].shape)
    _decode_out(*args, out=out, **kwargs)
    return out


def _decode_lse(*args, **kwargs):
    out, lse = args[0].new_empty(args[0].shape), _lse_like(args[0])
    _decode_out(*args, out=out, lse=lse, **kwargs)
    return out, lse


def _extend(*args, **kwargs):
    out = args[0].new_empty(args[0].shape)
    _extend_out(*args, out=out, **kwargs)
    return out


def _extend_lse(*args, **kwargs):
    out, lse = args[0].new_empty(args[0].shape), _lse_like(args[0])
    _extend_out(*args, out=out, lse=lse, **kwargs)
    return out, lse


def _moe(*args, **kwargs):
    out = args[0].new_empty(args[0].shape)
    _moe_out(*args, out=out, **kwargs)
    return out


def _prepare_weights(weights):
    require_bytes(weights, "weights", _capi.F4_E2M1X2)
    buf = _packed(_capi.SINGLE_TENSOR, (weights,), {0: _capi.F4_E2M1X2})
    _capi.check(_capi.lib.kiln_moe_prepare_weights(_capi.address(buf, _capi.SINGLE_TENSOR.tensor_base), _stream(weights)))


_EAGER = {"mha_prefill": _prefill, "mha_prefill_lse": _prefill_lse, "mha_prefill_out": _prefill_out,
          "mha_decode_with_kvcache": _decode, "mha_decode_with_kvcache_lse": _decode_lse,
          "mha_decode_with_kvcache_out": _decode_out, "mha_extend_with_kvcache": _extend,
          "mha_extend_with_kvcache_lse": _extend_lse, "mha_extend_with_kvcache_out": _extend_out, "kv_cache_append": _append,
          "moe_apply": _moe, "moe_apply_out": _moe_out,
          "moe_prepare_weights": _prepare_weights}
# CPU tensors reach kiln too, which refuses them by name ("q: must be in device memory").
for _name, _fn in _EAGER.items():
    _library.impl(_name, _fn, "CUDA")
    _library.impl(_name, _fn, "CPU")


# ---- fake implementations (torch.compile, meta tensors) -------------------------------------------
def _fake_same(*args, **kwargs):
    return _torch.empty_like(args[0], memory_format=_torch.contiguous_format)


def _fake_with_lse(*args, **kwargs):
    return _fake_same(*args), _lse_like(args[0])


def _fake_nothing(*args, **kwargs):
    return None


_FAKE = {"mha_prefill": _fake_same, "mha_prefill_lse": _fake_with_lse, "mha_prefill_out": _fake_nothing,
         "mha_decode_with_kvcache": _fake_same, "mha_decode_with_kvcache_lse": _fake_with_lse,
         "mha_decode_with_kvcache_out": _fake_nothing, "mha_extend_with_kvcache": _fake_same,
         "mha_extend_with_kvcache_lse": _fake_with_lse, "mha_extend_with_kvcache_out": _fake_nothing,
         "kv_cache_append": _fake_nothing, "moe_apply": _fake_same, "moe_apply_out": _fake_nothing,
         "moe_prepare_weights": _fake_nothing}
for _name, _fn in _FAKE.items():
    _torch.library.register_fake("kiln::" + _name, _fn, lib=_library)


# ---- scratch through torch's caching allocator ----------------------------------------------------
def _allocate(nbytes, device, stream, _user):
    try:
        return _torch.cuda.caching_allocator_alloc(nbytes, device, stream or 0)
    except Exception:  # out of memory: kiln reports it, naming the workspace
        return None


def _release(pointer, _nbytes, _device, _stream, _user):
    _torch.cuda.caching_allocator_delete(pointer)


_c_allocate = _capi.SCRATCH_ALLOCATE(_allocate)
_c_release = _capi.SCRATCH_RELEASE(_release)
_capi.check(_capi.lib.kiln_set_scratch_allocator(_capi.ctypes.cast(_c_allocate, _capi.ctypes.c_void_p),
                                                 _capi.ctypes.cast(_c_release, _capi.ctypes.c_void_p), None))


# ---- Python entry points --------------------------------------------------------------------------
def mha_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, out=None, lse=None, return_lse=False,
                **options):
    """torch.ops.kiln.mha_prefill[_lse|_out] by arguments: with `out` (and `lse`) writes them;
    otherwise returns out, or (out, lse) with return_lse."""
    ops = _torch.ops.kiln
    if out is not None:
        ops.mha_prefill_out(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out=out, lse=lse, **options)
        return (out, lse) if return_lse else out
    if return_lse:
        return ops.mha_prefill_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options)
    return ops.mha_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options)


def mha_decode_with_kvcache(q, k_cache, v_cache, page_table, cache_seqlens, *, out=None, lse=None, return_lse=False,
                            **options):
    """torch.ops.kiln.mha_decode_with_kvcache[_lse|_out] by arguments, as mha_prefill."""
    ops = _torch.ops.kiln
    if out is not None:
        ops.mha_decode_with_kvcache_out(q, k_cache, v_cache, page_table, cache_seqlens, out=out, lse=lse, **options)
        return (out, lse) if return_lse else out
    if return_lse:
        return ops.mha_decode_with_kvcache_lse(q, k_cache, v_cache, page_table, cache_seqlens, **options)
    return ops.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, cache_seqlens, **options)


def mha_extend_with_kvcache(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, *, out=None, lse=None,
                            return_lse=False, **options):
    """torch.ops.kiln.mha_extend_with_kvcache[_lse|_out] by arguments, as mha_prefill."""
    ops = _torch.ops.kiln
    inputs = (q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q)
    if out is not None:
        ops.mha_extend_with_kvcache_out(*inputs, out=out, lse=lse, **options)
        return (out, lse) if return_lse else out
    if return_lse:
        return ops.mha_extend_with_kvcache_lse(*inputs, **options)
    return ops.mha_extend_with_kvcache(*inputs, **options)


def kv_cache_append(k, v, slot_mapping, k_cache, v_cache, **options):
    """torch.ops.kiln.kv_cache_append: writes the caches in place."""
    _torch.ops.kiln.kv_cache_append(k, v, slot_mapping, k_cache, v_cache, **options)


def moe_apply(x, w13, w2, top_k, *, out=None, **options):
    """torch.ops.kiln.moe_apply[_out] by arguments."""
    if out is not None:
        _torch.ops.kiln.moe_apply_out(x, w13, w2, top_k, out=out, **options)
        return out
    return _torch.ops.kiln.moe_apply(x, w13, w2, top_k, **options)


def moe_prepare_weights(weights):
    """Rewrites uint8 MXFP4 weights in place into kiln's prepared order (then pass
    weight_format="mxfp4_prepared"); returns `weights`."""
    _torch.ops.kiln.moe_prepare_weights(weights)
    return weights


def warmup_for(step, *args, **kwargs):
    """Runs `step(*args, **kwargs)` with kiln's calls in prepare-only mode: every kernel the step
    needs at these shapes is selected, compiled or read from the cache, and loaded, and none is
    launched. Call it before capturing `step` in a CUDA graph. Returns what `step` returns (kiln's
    outputs in it are uninitialised)."""
    with prepare_only():
        result = step(*args, **kwargs)
    _torch.cuda.synchronize()
    return result
