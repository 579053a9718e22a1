"""The two back ends the example compares, over the same weights.

kiln:    a paged KV cache (pages of `page_size` tokens, scattered through one pool) of bf16 or
         (kv_dtype="e4m3") of e4m3 with one scale, written by kiln's kv_cache_append; prefill
         chunks through mha_extend_with_kvcache, decode through mha_decode_with_kvcache; the experts
         through moe_apply on the MXFP4 weights (prepared once), with bf16 activations or
         (activation_dtype="e4m3") W4A8.
PyTorch: what a user writes without kiln. A static cache per request slot ([slots, Hkv, L, D], as
         Transformers' StaticCache); prefill through FlexAttention (compiled) with the sinks applied
         exactly through its log-sum-exp; decode as batched matmuls with the sinks in the softmax
         denominator (one token per request: memory-bound, and capturable in a CUDA graph); the
         experts through torch._grouped_mm on weights dequantized to bf16 once.
reference: attention and experts in float64 on the same inputs (the MXFP4 weights expanded exactly,
         only the result rounded to bf16): what the parity test measures both back ends against.
         With kv_dtype="e4m3" its cache holds K and V rounded as kiln's e4m3 cache holds them.
"""
import random

import torch

import mxfp4

BACKENDS = ("kiln", "torch")
KV_DTYPES = ("bf16", "e4m3")


def _check_kv(kv_dtype, kv_scale):
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype: expected one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    if not kv_scale > 0:
        raise ValueError(f"kv_scale: expected a positive number, got {kv_scale!r}")


def e4m3_round_trip(x, scale):
    """x as an e4m3 cache with `scale` holds it, in float64: x / scale rounded to the nearest e4m3
    (ties to even), saturating at +-448, times scale (what kiln's kv_cache_append stores)."""
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float64) * scale


class KilnBackend:
    name = "kiln"

    def __init__(self, config, weights, slots, max_len, page_size, seed=0, activation_dtype="bf16", kv_dtype="bf16", kv_scale=1.0):
        import kiln  # noqa: F401  (registers torch.ops.kiln)
        import kiln.torch as kt
        self.kt, self.config = kt, config
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"page_size: expected a power of two, got {page_size}")
        _check_kv(kv_dtype, kv_scale)
        self.page_size = page_size
        self.activation_dtype = activation_dtype
        # k_scale and v_scale for kiln's calls: the e4m3 cache's one scale (none for a bf16 cache).
        self.scales = dict(k_scale=kv_scale, v_scale=kv_scale) if kv_dtype == "e4m3" else {}
        cache_dtype = torch.float8_e4m3fn if kv_dtype == "e4m3" else torch.bfloat16
        pages_per_slot = -(-max_len // page_size)
        pool = list(range(slots * pages_per_slot))
        random.Random(seed).shuffle(pool)  # pages land anywhere in the pool, as a serving engine's do
        device = weights.embed.device
        self.page_table = torch.tensor(pool, dtype=torch.int32, device=device).view(slots, pages_per_slot)
        shape = (slots * pages_per_slot, page_size, config.kv_heads, config.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=cache_dtype, device=device) for _ in range(config.layers)]
        self.v_cache = [torch.zeros(shape, dtype=cache_dtype, device=device) for _ in range(config.layers)]
        for w in weights.layers:  # kiln's prepared MXFP4 order: the same values, cheaper to decode
            kt.moe_prepare_weights(w.w13)
            kt.moe_prepare_weights(w.w2)
        self.weights = weights

    def begin(self, step):
        ps = self.page_size
        rows = self.page_table[step.token_slots, step.positions // ps].long()
        self.slot_mapping = rows * ps + step.positions % ps
        self.step_pages = self.page_table[:step.seq_lens.shape[0]] if step.decode else self.page_table[step.slots]

    def attention(self, layer, q, k, v, step):
        c, w, kt = self.config, self.weights.layers[layer], self.kt
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        kt.kv_cache_append(k, v, self.slot_mapping, kc, vc, **self.scales)
        window = c.sliding_window - 1 if c.sliding(layer) else None
        if step.decode:
            return kt.mha_decode_with_kvcache(q, kc, vc, self.step_pages, step.seq_lens, sinks=w.sinks, window_left=window, **self.scales)
        return kt.mha_extend_with_kvcache(q, kc, vc, self.step_pages, step.seq_lens, step.cu_seqlens_q, step.max_q,
                                          sinks=w.sinks, window_left=window, causal=True, **self.scales)

    def experts(self, layer, x, router_logits):
        w = self.weights.layers[layer]
        return self.kt.moe_apply(x, w.w13, w.w2, self.config.top_k, router_logits=router_logits, routing="topk_softmax",
                                 w13_scale=w.w13_scale, w13_bias=w.w13_bias, w2_scale=w.w2_scale, w2_bias=w.w2_bias,
                                 activation="swiglu_clamped", gate_up_layout="interleaved", weight_format="mxfp4_prepared",
                                 activation_dtype=self.activation_dtype)


_flex = None
_FLEX_BLOCK = 128


def _round_up(n, block):
    return -(-n // block) * block


def _compiled_flex():
    global _flex
    if _flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)  # a kernel per shape
        _flex = torch.compile(flex_attention, dynamic=False)
    return _flex


class TorchBackend:
    name = "torch"

    def __init__(self, config, weights, slots, max_len, page_size=None, seed=0, activation_dtype=torch.bfloat16):
        self.config, device = config, weights.embed.device
        self.activation_dtype = activation_dtype  # the experts' gate and up, between the two GEMMs
        # FlexAttention's kernels take lengths in whole 128-token blocks: the cache has room to pad to one.
        shape = (slots, config.kv_heads, _round_up(max_len, _FLEX_BLOCK), config.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(config.layers)]
        self.v_cache = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(config.layers)]
        self.w13, self.w2 = [], []
        for w in weights.layers:  # dequantized once; the MXFP4 bytes are dropped
            self.w13.append(mxfp4.dequantize(w.w13, w.w13_scale))
            self.w2.append(mxfp4.dequantize(w.w2, w.w2_scale))
            w.w13 = w.w13_scale = w.w2 = w.w2_scale = None
        self.weights = weights
        self.decode_len = max_len

    # ---- attention --------------------------------------------------------------------------------
    def begin(self, step):
        if step.decode:
            idx = torch.arange(self.decode_len, device=step.seq_lens.device)
            lens = step.seq_lens.long()[:, None]
            self.visible = {False: idx < lens, True: (idx < lens) & (idx >= lens - self.config.sliding_window)}
        else:
            self.masks = {}

    def _block_mask(self, sliding, q_len, kv_len, start):
        key = (sliding, q_len, kv_len, start)
        if key not in self.masks:
            from torch.nn.attention.flex_attention import create_block_mask
            device = self.k_cache[0].device
            # Tensors, not constants: one compiled kernel serves every chunk offset and both layer kinds.
            offset = torch.tensor(start, device=device)
            window = torch.tensor(self.config.sliding_window if sliding else kv_len + 1, device=device)

            def mask(b, h, q_idx, kv_idx):
                return (kv_idx <= q_idx + offset) & (kv_idx > q_idx + offset - window)
            self.masks[key] = create_block_mask(mask, None, None, q_len, kv_len, device=device)
        return self.masks[key]

    def attention(self, layer, q, k, v, step):
        c, w = self.config, self.weights.layers[layer]
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        if step.decode:
            B = q.shape[0]
            kc[step.slots, :, step.positions] = k
            vc[step.slots, :, step.positions] = v
            keys, values = kc[:B, :, :self.decode_len], vc[:B, :, :self.decode_len]
            group = c.heads // c.kv_heads
            scores = torch.matmul(q.view(B, c.kv_heads, group, c.head_dim), keys.transpose(-1, -2)).float()
            scores = scores * c.head_dim ** -0.5
            scores = scores.masked_fill(~self.visible[c.sliding(layer)][:, None, None, :], float("-inf"))
            sinks = w.sinks.view(1, c.kv_heads, group, 1).expand(B, -1, -1, 1)
            probs = torch.softmax(torch.cat((scores, sinks), dim=-1), dim=-1)[..., :-1]
            return torch.matmul(probs.to(values.dtype), values).view(B, c.heads, c.head_dim)
        from torch.nn.attention.flex_attention import AuxRequest
        out = torch.empty_like(q)
        cu = step.cu_seqlens_q.tolist()
        for r, (slot, start, n) in enumerate(zip(step.slots.tolist(), step.starts, step.q_lens)):
            kc[slot, :, start:start + n] = k[cu[r]:cu[r + 1]].transpose(0, 1)
            vc[slot, :, start:start + n] = v[cu[r]:cu[r + 1]].transpose(0, 1)
            # Queries and keys padded to whole blocks; the padded rows are dropped, padded keys masked.
            q_pad, kv_pad = _round_up(n, _FLEX_BLOCK), _round_up(start + n, _FLEX_BLOCK)
            qr = q.new_zeros((1, c.heads, q_pad, c.head_dim))
            qr[0, :, :n] = q[cu[r]:cu[r + 1]].transpose(0, 1)
            mask = self._block_mask(c.sliding(layer), q_pad, kv_pad, start)
            o, aux = _compiled_flex()(qr, kc[slot:slot + 1, :, :kv_pad], vc[slot:slot + 1, :, :kv_pad], block_mask=mask,
                                      scale=c.head_dim ** -0.5, enable_gqa=True, return_aux=AuxRequest(lse=True))
            keep = torch.sigmoid(aux.lse[:, :, :n] - w.sinks[None, :, None])  # exp(lse) / (exp(lse) + exp(sink))
            out[cu[r]:cu[r + 1]] = (o[:, :, :n].float() * keep[..., None]).to(q.dtype)[0].transpose(0, 1)
        return out

    # ---- experts ----------------------------------------------------------------------------------
    def experts(self, layer, x, router_logits):
        c, w = self.config, self.weights.layers[layer]
        top = torch.topk(router_logits.float(), c.top_k, dim=-1)
        weights = torch.softmax(top.values, dim=-1)
        ids = top.indices.flatten()
        ids_sorted, order = torch.sort(ids)
        counts = torch.histc(ids_sorted.int(), bins=c.experts, min=0, max=c.experts - 1)
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        rows = x[order // c.top_k]
        # bf16 by default, as Transformers' grouped_mm experts path computes them.
        dtype = self.activation_dtype
        gate_up = torch._grouped_mm(rows, self.w13[layer].transpose(1, 2), offs=offsets).to(dtype) + w.w13_bias[ids_sorted].to(dtype)
        gate = gate_up[:, 0::2].clamp(max=c.swiglu_limit)
        up = gate_up[:, 1::2].clamp(-c.swiglu_limit, c.swiglu_limit)
        h = (gate * torch.sigmoid(c.swiglu_alpha * gate) * (up + 1)).to(x.dtype)
        out = torch._grouped_mm(h, self.w2[layer].transpose(1, 2), offs=offsets) + w.w2_bias[ids_sorted]
        combined = torch.empty_like(out, dtype=torch.float32)
        combined[order] = out.float() * weights.flatten()[order, None]
        return combined.view(-1, c.top_k, c.hidden).sum(1).to(x.dtype)


class ReferenceBackend:
    """Attention and experts in float64 on the bf16 inputs the model gives them; the rest of the
    model (projections, norms, rotary) is the shared bf16 code. Reads lengths on the host, so its
    decode steps run eagerly (graphs=False)."""
    name = "reference"

    def __init__(self, config, weights, slots, max_len, page_size=None, seed=0, kv_dtype="bf16", kv_scale=1.0):
        _check_kv(kv_dtype, kv_scale)
        self.config, device = config, weights.embed.device
        self.stored = (lambda x: e4m3_round_trip(x, kv_scale)) if kv_dtype == "e4m3" else (lambda x: x.double())
        shape = (slots, config.kv_heads, max_len, config.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=torch.float64, device=device) for _ in range(config.layers)]
        self.v_cache = [torch.zeros(shape, dtype=torch.float64, device=device) for _ in range(config.layers)]
        # float32 holds every MXFP4 value exactly; widened to float64 an expert at a time.
        self.w13 = [mxfp4.dequantize(w.w13, w.w13_scale, torch.float32) for w in weights.layers]
        self.w2 = [mxfp4.dequantize(w.w2, w.w2_scale, torch.float32) for w in weights.layers]
        self.weights = weights

    def begin(self, step):
        pass

    def attention(self, layer, q, k, v, step):
        c, w = self.config, self.weights.layers[layer]
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        group, out = c.heads // c.kv_heads, torch.empty_like(q)
        cu, ends = step.cu_seqlens_q.tolist(), step.seq_lens.tolist()
        for r, slot in enumerate(step.slots.tolist()):
            n, end = cu[r + 1] - cu[r], ends[r]
            start = end - n
            kc[slot, :, start:end] = self.stored(k[cu[r]:cu[r + 1]].transpose(0, 1))
            vc[slot, :, start:end] = self.stored(v[cu[r]:cu[r + 1]].transpose(0, 1))
            queries = q[cu[r]:cu[r + 1]].double().view(n, c.kv_heads, group, c.head_dim).permute(1, 2, 0, 3)
            scores = queries @ kc[slot, :, None, :end].transpose(-1, -2) * c.head_dim ** -0.5  # [Hkv, group, n, end]
            q_pos = torch.arange(start, end, device=q.device)[:, None]
            k_pos = torch.arange(end, device=q.device)[None, :]
            visible = k_pos <= q_pos
            if c.sliding(layer):
                visible &= k_pos > q_pos - c.sliding_window
            scores = scores.masked_fill(~visible, float("-inf"))
            sinks = w.sinks.double().view(c.kv_heads, group, 1, 1).expand(-1, -1, n, 1)
            probs = torch.softmax(torch.cat((scores, sinks), dim=-1), dim=-1)[..., :-1]
            o = probs @ vc[slot, :, None, :end]  # [Hkv, group, n, D]
            out[cu[r]:cu[r + 1]] = o.permute(2, 0, 1, 3).reshape(n, c.heads, c.head_dim).to(q.dtype)
        return out

    def experts(self, layer, x, router_logits):
        c, w = self.config, self.weights.layers[layer]
        top = torch.topk(router_logits.float(), c.top_k, dim=-1)  # the same bf16 logits the others route on
        weights = torch.softmax(top.values.double(), dim=-1)
        rows, out = x.double(), torch.zeros(x.shape, dtype=torch.float64, device=x.device)
        for e in top.indices.unique().tolist():
            tokens, slots = (top.indices == e).nonzero(as_tuple=True)
            gate_up = rows[tokens] @ self.w13[layer][e].double().T + w.w13_bias[e].double()
            gate = gate_up[:, 0::2].clamp(max=c.swiglu_limit)
            up = gate_up[:, 1::2].clamp(-c.swiglu_limit, c.swiglu_limit)
            h = gate * torch.sigmoid(c.swiglu_alpha * gate) * (up + 1)
            y = h @ self.w2[layer][e].double().T + w.w2_bias[e].double()
            out.index_add_(0, tokens, y * weights[tokens, slots, None])
        return out.to(x.dtype)


def make_backend(name, config, weights, slots, max_len, page_size, seed=0, **options):
    if name == "reference":
        return ReferenceBackend(config, weights, slots, max_len, page_size, seed, **options)
    if name == "kiln":
        return KilnBackend(config, weights, slots, max_len, page_size, seed, **options)
    if name == "torch":
        return TorchBackend(config, weights, slots, max_len, page_size, seed, **options)
    known = ", ".join(BACKENDS + ("reference",))
    raise ValueError(f"backend: expected one of {known}, got {name!r}")
