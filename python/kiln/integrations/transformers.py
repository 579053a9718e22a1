"""kiln inside Hugging Face Transformers (5.x): attention and mixture-of-experts layers.

    import kiln.integrations.transformers as kiln_hf
    model = GptOssForCausalLM(config)            # any model, on a CUDA device, bf16 or f16
    kiln_hf.enable(model)                        # registers "kiln" and switches the model to it

Attention: every model that routes attention through Transformers' attention interface runs on
kiln's mha_prefill (bottom-right causal, sliding windows, GPT-OSS's sinks, softcap), with padding
masks honoured: padded tokens are dropped before the kernel and their outputs are zero.
Experts: models whose experts use Transformers' experts interface (GPT-OSS, Mixtral, Qwen-MoE
and others) run on kiln's moe_apply with the routing the model computed. enable() rewrites each
expert weight in place into the order kiln reads (the same values and shape, other strides), so
no second copy is kept.
"""
import torch

from .. import torch as _kiln_torch
from .._errors import UnsupportedError, invalid_argument

NAME = "kiln"
_GPT_OSS_ALPHA, _GPT_OSS_LIMIT = 1.702, 7.0


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, softcap=None,
              s_aux=None, **kwargs):
    """Transformers' attention interface: query [B, H, S, D], key and value [B, Hkv, L, D];
    attention_mask None (no padding) or a 2D [B, L] mask of the tokens present. Returns
    ([B, S, H, D], None)."""
    if dropout:
        raise invalid_argument(f"dropout: kiln's attention is for inference, got {dropout}")
    if query.dim() != 4 or key.dim() != 4:
        raise invalid_argument(f"query, key: expected [B, H, S, D] tensors, got {tuple(query.shape)}, {tuple(key.shape)}")
    B, H, S, D = query.shape
    L = key.shape[2]
    causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
    options = dict(softmax_scale=scaling, softcap=softcap or None, causal=bool(causal),
                   window_left=sliding_window - 1 if sliding_window else None,
                   sinks=None if s_aux is None else s_aux.float().contiguous())
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if attention_mask is None:
        device = query.device
        cu_q = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device=device)
        cu_k = torch.arange(0, (B + 1) * L, L, dtype=torch.int32, device=device)
        out = _kiln_torch.mha_prefill(q.reshape(B * S, H, D), k.reshape(B * L, -1, D), v.reshape(B * L, -1, D), cu_q, cu_k, S, L,
                                      **options)
        return out.view(B, S, H, D), None
    if attention_mask.dim() != 2 or attention_mask.shape != (B, L):
        raise invalid_argument(f"attention_mask: expected None or a [batch, keys] = [{B}, {L}] mask of present tokens "
                               f"(register kiln's mask function: kiln.integrations.transformers.register()), got "
                               f"{tuple(attention_mask.shape)}")
    present_k = attention_mask.bool()
    present_q = present_k[:, L - S:]
    lens_q, lens_k = present_q.sum(1, dtype=torch.int32), present_k.sum(1, dtype=torch.int32)
    cu_q = torch.nn.functional.pad(lens_q.cumsum(0, dtype=torch.int32), (1, 0))
    cu_k = torch.nn.functional.pad(lens_k.cumsum(0, dtype=torch.int32), (1, 0))
    packed = _kiln_torch.mha_prefill(q[present_q], k[present_k], v[present_k], cu_q, cu_k, int(lens_q.max()), int(lens_k.max()),
                                     **options)
    out = query.new_zeros((B, S, H, D))
    out[present_q] = packed
    return out, None


def _activation(module):
    """kiln's name for the module's gated activation, or a clear refusal."""
    if hasattr(module, "alpha") and hasattr(module, "limit"):  # GPT-OSS's clamped SwiGLU
        if (float(module.alpha), float(module.limit)) != (_GPT_OSS_ALPHA, _GPT_OSS_LIMIT):
            raise UnsupportedError(f"{type(module).__name__}: kiln's clamped SwiGLU has alpha {_GPT_OSS_ALPHA} and limit "
                                   f"{_GPT_OSS_LIMIT}, the module has {module.alpha} and {module.limit}")
        return "swiglu_clamped"
    act = getattr(module, "act_fn", None)
    if isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation":
        return "silu_glu"
    raise UnsupportedError(f"{type(module).__name__}: kiln's experts run SiLU-gated or GPT-OSS's clamped SwiGLU experts, "
                           f"not {type(act).__name__}")


def _kiln_layout(weight, transposed):
    """The [E, N, K] view kiln reads (K the reduction), made contiguous once."""
    w = weight.transpose(1, 2) if transposed else weight
    if not w.is_contiguous():
        _to_kiln_order(weight, transposed)
        w = weight.transpose(1, 2) if transposed else weight
    return w


def _to_kiln_order(weight, transposed):
    with torch.no_grad():
        w = weight.data.transpose(1, 2) if transposed else weight.data
        w = w.contiguous()
        weight.data = w.transpose(1, 2) if transposed else w


def experts(module, hidden_states, top_k_index, top_k_weights):
    """Transformers' experts interface: hidden_states [T, H], the model's own routing
    (top_k_index [T, k], top_k_weights [T, k]). Returns [T, H]."""
    if not getattr(module, "has_gate", True):
        raise UnsupportedError(f"{type(module).__name__}: kiln's experts are gated (gate and up projections)")
    transposed = bool(getattr(module, "is_transposed", False))
    w13 = _kiln_layout(module.gate_up_proj, transposed)
    w2 = _kiln_layout(module.down_proj, transposed)
    has_bias = getattr(module, "has_bias", False)
    return _kiln_torch.moe_apply(hidden_states.contiguous(), w13, w2, top_k_index.shape[-1], topk_ids=top_k_index.to(torch.int32),
                                 topk_weights=top_k_weights.float(), w13_bias=module.gate_up_proj_bias if has_bias else None,
                                 w2_bias=module.down_proj_bias if has_bias else None, activation=_activation(module),
                                 gate_up_layout="concatenated" if getattr(module, "is_concatenated", True) else "interleaved")


def register():
    """Registers "kiln" with Transformers' attention, mask and experts interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register(NAME, attention)
    # kiln takes what FlashAttention takes: no mask, or the 2D mask of present tokens.
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:  # a Transformers without the experts interface: attention only
        return False
    ExpertsInterface.register(NAME, experts)
    return True


def enable(model, attention=True, experts=True):
    """Switches a built model to kiln: its attention, and its experts where Transformers lets a
    model choose their implementation. Expert weights are rewritten in place into kiln's order.
    Returns the model."""
    has_experts = register()
    config = model.config
    if attention:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(NAME)
        else:
            config._attn_implementation = NAME
    if experts:
        if not has_experts or not hasattr(config, "_experts_implementation"):
            raise UnsupportedError("this Transformers has no experts interface (transformers.integrations.moe."
                                   "ExpertsInterface): pass experts=False, or use a newer Transformers")
        found = 0
        for module in model.modules():
            if hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and hasattr(module, "is_transposed"):
                _activation(module)
                _to_kiln_order(module.gate_up_proj, module.is_transposed)
                _to_kiln_order(module.down_proj, module.is_transposed)
                found += 1
        if not found:
            raise UnsupportedError(f"{type(model).__name__}: no experts module that uses Transformers' experts interface")
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation(NAME)
        else:
            config._experts_implementation = NAME
    return model
