"""Every operator through torch.ops.kiln against float64 references on random inputs, CUDA graph
capture and replay, a capture that would need a compile, and torch.compile on the GPU."""
import math

import pytest
import torch

import kiln
import kiln.torch as kt

pytestmark = pytest.mark.gpu
DEV = "cuda"
BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def relative_error(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


# ---- float64 references -----------------------------------------------------------------------------
def attention_reference(q, k, v, *, causal, window, sinks, softcap, scale):
    """One sequence: q [Lq, Hq, D], k/v [Lk, Hkv, D]; causal aligned bottom-right. Returns
    (out [Lq, Hq, D], lse [Lq, Hq]) in float64."""
    q, k, v = q.double(), k.double(), v.double()
    lq, hq, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    qpos = torch.arange(lq, device=q.device)[:, None] + lk - lq
    kpos = torch.arange(lk, device=q.device)[None, :]
    visible = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if causal:
        visible &= kpos <= qpos
    if window is not None:
        visible &= kpos >= qpos - window
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1)
    if sinks is not None:
        m = torch.maximum(m, sinks.double()[:, None])
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe[..., None])
    denominator = p.sum(-1)
    if sinks is not None:
        denominator = denominator + torch.exp(sinks.double()[:, None] - m_safe)
    out = torch.einsum("hqk,khd->qhd", p, v) / denominator.clamp_min(1e-300).transpose(0, 1)[..., None]
    out = torch.where(denominator.transpose(0, 1)[..., None] > 0, out, torch.zeros_like(out))
    lse = (m_safe + torch.log(denominator)).transpose(0, 1)
    return out, lse


def e2m1_values():
    magnitudes = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    return torch.cat([magnitudes, -magnitudes]).to(DEV)


def dequantize_mxfp4(packed, scales):
    """uint8 [..., n/2] codes (low nibble first) and e8m0 [..., n/32] scales -> float64 [..., n]."""
    table = e2m1_values()
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    values = table[codes]
    scale = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)
    return values * scale


def mxfp8(values):
    """W4A8's activation quantization, modelled with torch's own e4m3 rounding: blocks of 32 along
    the last dimension, each scaled by the least power of two that leaves nothing above 448."""
    blocks = values.double().unflatten(-1, (-1, 32))
    mantissa, exponent = torch.frexp(blocks.abs().amax(-1, keepdim=True) / 448)
    scale = torch.pow(2.0, (exponent - (mantissa == 0.5).long()).clamp(-126, 127).double())
    return ((blocks / scale).to(torch.float8_e4m3fn).double() * scale).flatten(-2)


def moe_reference(x, w13, w2, logits, top_k, b13, b2, w4a8=False):
    """GPT-OSS routing (top-k, then softmax over those), clamped SwiGLU, interleaved gate/up. w4a8:
    x, and act rounded to bf16, quantized to MXFP8 before their projections."""
    x = mxfp8(x) if w4a8 else x.double()
    weights, ids = torch.topk(logits.double(), top_k, dim=-1)
    weights = torch.softmax(weights, dim=-1)
    out = torch.zeros_like(x)
    for j in range(top_k):
        e = ids[:, j]
        h = torch.einsum("th,tnh->tn", x, w13[e]) + b13[e]
        gate, up = h[:, 0::2].clamp(max=7.0), h[:, 1::2].clamp(-7.0, 7.0)
        act = gate * torch.sigmoid(1.702 * gate) * (up + 1)
        if w4a8:
            act = mxfp8(act.to(torch.bfloat16))
        y = torch.einsum("ti,thi->th", act, w2[e]) + b2[e]
        out += weights[:, j:j + 1] * y
    return out


# ---- prefill -------------------------------------------------------------------------------------
PREFILL_CASES = [
    # dtype, head_dim, hq, hkv, causal, window, sinks, softcap
    (torch.bfloat16, 64, 64, 8, True, 128, True, None),      # GPT-OSS sliding layer
    (torch.bfloat16, 64, 64, 8, True, None, True, None),     # GPT-OSS full layer
    (torch.float16, 128, 32, 8, False, None, False, None),
    (torch.bfloat16, 128, 32, 8, False, 100, False, None),  # a window without causal masking reaches the end
    (torch.float16, 128, 16, 16, True, None, False, 30.0),
    (torch.bfloat16, 256, 16, 8, True, None, False, None),   # Gemma's head_dim
]


@pytest.mark.parametrize("dtype, d, hq, hkv, causal, window, sinks, softcap", PREFILL_CASES)
def test_prefill_matches_float64_on_strided_views(dtype, d, hq, hkv, causal, window, sinks, softcap):
    torch.manual_seed(1)
    lengths = [37, 300, 5, 129]
    total = sum(lengths)
    # q, k and v are views into one packed projection, as an engine's QKV linear leaves them.
    qkv = torch.randn(total, hq + 2 * hkv, d, dtype=dtype, device=DEV)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    cu = torch.tensor([0] + lengths, device=DEV).cumsum(0).to(torch.int32)
    sink = torch.randn(hq, device=DEV) if sinks else None
    out, lse = poisoned((total, hq, d), dtype), poisoned((total, hq), torch.float32)
    kt.mha_prefill(q, k, v, cu, cu, max(lengths), max(lengths), out=out, lse=lse, causal=causal, window_left=window,
                   sinks=sink, softcap=softcap)
    functional = torch.ops.kiln.mha_prefill(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal, window_left=window,
                                            sinks=sink, softcap=softcap)
    torch.cuda.synchronize()
    assert torch.equal(functional, out)
    refs, lses = [], []
    for b in range(len(lengths)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        r, l = attention_reference(q[rows], k[rows], v[rows], causal=causal, window=window, sinks=sink, softcap=softcap,
                                   scale=1 / math.sqrt(d))
        refs.append(r)
        lses.append(l)
    assert relative_error(out, torch.cat(refs)) < BOUND[dtype]
    assert relative_error(lse, torch.cat(lses)) < 1e-4


# ---- decode over a paged cache ------------------------------------------------------------------------
def paged_problem(batch, lengths, hq, hkv, d, page_size, dtype, q_len, seed=2):
    torch.manual_seed(seed)
    max_pages = max(math.ceil(n / page_size) for n in lengths)
    num_pages = batch * max_pages + 3
    k_cache = torch.randn(num_pages, page_size, hkv, d, dtype=dtype, device=DEV)
    v_cache = torch.randn(num_pages, page_size, hkv, d, dtype=dtype, device=DEV)
    table = torch.randperm(num_pages, device=DEV)[:batch * max_pages].view(batch, max_pages).to(torch.int32)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    q = torch.randn(batch * q_len, hq, d, dtype=dtype, device=DEV)
    return q, k_cache, v_cache, table, lens


def decode_reference(q, k_cache, v_cache, table, lens, q_len, **options):
    outs = []
    for b, n in enumerate(lens.tolist()):
        pages = table[b]
        k = k_cache[pages.long()].flatten(0, 1)[:n]
        v = v_cache[pages.long()].flatten(0, 1)[:n]
        r, _ = attention_reference(q[b * q_len:(b + 1) * q_len], k, v, causal=True, **options)
        outs.append(r)
    return torch.cat(outs)


@pytest.mark.parametrize("dtype, d, q_len, page_size, window, sinks", [
    (torch.bfloat16, 64, 1, 16, None, True),
    (torch.bfloat16, 64, 4, 64, 128, True),
    (torch.float16, 128, 1, 32, None, False),
    (torch.float16, 128, 8, 16, None, False),
    (torch.bfloat16, 256, 1, 16, 1024, False),  # Gemma-3's head_dim and local window
])
def test_decode_matches_float64_with_shuffled_pages(dtype, d, q_len, page_size, window, sinks):
    hq, hkv = {64: (64, 8), 128: (32, 8), 256: (16, 8)}[d]
    lengths = [1000, 17, 4096, 300]
    q, kc, vc, table, lens = paged_problem(4, lengths, hq, hkv, d, page_size, dtype, q_len)
    sink = torch.randn(hq, device=DEV) if sinks else None
    out = poisoned(q.shape, dtype)
    kt.mha_decode_with_kvcache(q, kc, vc, table, lens, out=out, q_len=q_len, window_left=window, sinks=sink)
    torch.cuda.synchronize()
    ref = decode_reference(q, kc, vc, table, lens, q_len, window=window, sinks=sink, softcap=None, scale=1 / math.sqrt(d))
    assert relative_error(out, ref) < BOUND[dtype]


@pytest.mark.parametrize("page_size", [1, 2, 16, 256])
def test_decode_every_page_size_and_sixteen_speculative_tokens(page_size):
    lengths = [16, 700, 2049]
    for q_len in (1, 16):
        q, kc, vc, table, lens = paged_problem(3, lengths, 64, 8, 64, page_size, torch.bfloat16, q_len)
        sink = torch.randn(64, device=DEV)
        out = torch.ops.kiln.mha_decode_with_kvcache(q, kc, vc, table, lens, q_len=q_len, sinks=sink)
        ref = decode_reference(q, kc, vc, table, lens, q_len, window=None, sinks=sink, softcap=None, scale=1 / 8)
        assert relative_error(out, ref) < BOUND[torch.bfloat16], q_len


# ---- extend and append -----------------------------------------------------------------------------
def extend_problem(new, prefix, hq, hkv, d, page_size, dtype, seed=4):
    """Sequences with `prefix[b]` cached keys and `new[b]` new tokens, K and V contiguous per
    sequence, plus a shuffled paged cache that holds the prefixes only."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    total = [p + n for p, n in zip(prefix, new)]
    max_pages = max(math.ceil(t / page_size) for t in total)
    num_pages = len(new) * max_pages + 2
    k = [torch.randn(t, hkv, d, device=DEV, generator=g).to(dtype) for t in total]
    v = [torch.randn(t, hkv, d, device=DEV, generator=g).to(dtype) for t in total]
    q = torch.randn(sum(new), hq, d, device=DEV, generator=g).to(dtype)
    table = torch.randperm(num_pages, device=DEV, generator=g)[:len(new) * max_pages].view(len(new), max_pages).to(torch.int32)
    k_cache = torch.full((num_pages, page_size, hkv, d), float("nan"), dtype=dtype, device=DEV)
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = []
    for b, t in enumerate(total):
        rows = table[b].long()[:, None] * page_size + torch.arange(page_size, device=DEV)
        slots.append(rows.flatten()[:t])
    for b, p in enumerate(prefix):
        k_cache.view(-1, hkv, d)[slots[b][:p]] = k[b][:p]
        v_cache.view(-1, hkv, d)[slots[b][:p]] = v[b][:p]
    new_slots = torch.cat([slots[b][p:] for b, p in enumerate(prefix)])
    new_k = torch.cat([k[b][p:] for b, p in enumerate(prefix)])
    new_v = torch.cat([v[b][p:] for b, p in enumerate(prefix)])
    cu = torch.tensor([0] + new, device=DEV).cumsum(0).to(torch.int32)
    lens = torch.tensor(total, dtype=torch.int32, device=DEV)
    return q, k, v, k_cache, v_cache, table, lens, cu, new_k, new_v, new_slots


@pytest.mark.parametrize("page_size, d, window, sinks", [(1, 64, None, True), (16, 128, None, False), (64, 64, 128, True),
                                                         (256, 128, 50, False), (16, 256, None, False)])
def test_append_then_extend_equals_attention_over_the_whole_sequence(page_size, d, window, sinks):
    hq, hkv = (64, 8) if d == 64 else (32, 8)
    new, prefix = [300, 1, 77], [0, 4100, 1000]
    q, k, v, kc, vc, table, lens, cu, nk, nv, slots = extend_problem(new, prefix, hq, hkv, d, page_size, torch.bfloat16)
    sink = torch.randn(hq, device=DEV) if sinks else None
    torch.ops.kiln.kv_cache_append(nk, nv, slots, kc, vc)
    out, lse = kt.mha_extend_with_kvcache(q, kc, vc, table, lens, cu, max(new), return_lse=True, window_left=window, sinks=sink)
    torch.cuda.synchronize()
    refs, lses = [], []
    for b in range(len(new)):
        r, l = attention_reference(q[int(cu[b]):int(cu[b + 1])], k[b], v[b], causal=True, window=window, sinks=sink, softcap=None,
                                   scale=1 / math.sqrt(d))
        refs.append(r)
        lses.append(l)
    assert relative_error(out, torch.cat(refs)) < BOUND[torch.bfloat16]
    assert relative_error(lse, torch.cat(lses)) < 1e-4


@pytest.mark.parametrize("page_size, d, window, sinks", [(16, 128, None, False), (16, 64, 128, True), (8, 256, None, True)])
def test_append_then_extend_over_an_e4m3_cache(page_size, d, window, sinks):
    """Chunked prefill over an fp8 KV cache: every row goes in through kv_cache_append with
    per-tensor scales, and extend matches float64 attention over the values the cache holds."""
    hq, hkv = (64, 8) if d == 64 else (16, 8)
    new, prefix = [200, 1, 77], [0, 700, 300]
    q, k, v, kc, _, table, lens, cu, _, _, _ = extend_problem(new, prefix, hq, hkv, d, page_size, torch.bfloat16)
    k_scale, v_scale = 0.05, 0.02
    kc8 = torch.zeros(kc.shape, dtype=torch.float8_e4m3fn, device=DEV)
    vc8 = torch.zeros_like(kc8)
    pages = [table[b].long()[:, None] * page_size + torch.arange(page_size, device=DEV) for b in range(len(new))]
    rows = [pages[b].flatten()[:len(k[b])] for b in range(len(new))]  # sequence b's slots, prefix and new
    kiln.kv_cache_append(torch.cat(k), torch.cat(v), torch.cat(rows), kc8, vc8, k_scale=k_scale, v_scale=v_scale)
    sink = torch.randn(hq, device=DEV) if sinks else None
    out, lse = kt.mha_extend_with_kvcache(q, kc8, vc8, table, lens, cu, max(new), return_lse=True, window_left=window, sinks=sink,
                                          k_scale=k_scale, v_scale=v_scale)
    torch.cuda.synchronize()
    held_k = kc8.view(-1, hkv, d).double() * k_scale  # converted whole: float8 tensors take few operations
    held_v = vc8.view(-1, hkv, d).double() * v_scale
    refs, lses = [], []
    for b in range(len(new)):
        r, l = attention_reference(q[int(cu[b]):int(cu[b + 1])], held_k[rows[b]], held_v[rows[b]], causal=True, window=window,
                                   sinks=sink, softcap=None, scale=1 / math.sqrt(d))
        refs.append(r)
        lses.append(l)
    assert relative_error(out, torch.cat(refs)) < BOUND[torch.bfloat16]
    assert relative_error(lse, torch.cat(lses)) < 1e-3  # the scores multiply in f16 (q converted, times k_scale)


def test_append_to_an_e4m3_cache_quantizes_like_torch():
    k = torch.randn(100, 8, 64, dtype=torch.bfloat16, device=DEV) * 50
    v = torch.randn(100, 8, 64, dtype=torch.bfloat16, device=DEV)
    kc = torch.zeros(64, 4, 8, 64, dtype=torch.float8_e4m3fn, device=DEV)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(256, device=DEV)[:100]
    skipped = int(slots[7])
    slots[7] = -1  # token 7 is not written
    kiln.kv_cache_append(k, v, slots, kc, vc, k_scale=0.5, v_scale=0.02)
    torch.cuda.synchronize()
    kept = slots >= 0
    # torch rounds to nearest even and saturates at 448 only when asked: clamp first.
    want_k = (k.float() / 0.5).clamp(-448, 448).to(torch.float8_e4m3fn)
    want_v = (v.float() / 0.02).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(kc.view(-1, 8, 64)[slots[kept]].view(torch.uint8), want_k[kept].view(torch.uint8))
    assert torch.equal(vc.view(-1, 8, 64)[slots[kept]].view(torch.uint8), want_v[kept].view(torch.uint8))
    assert kc.view(-1, 8, 64)[skipped].view(torch.uint8).eq(0).all()


# ---- mixture of experts ------------------------------------------------------------------------------
def moe_problem(tokens, hidden=512, inter=256, experts=8, seed=3):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(tokens, hidden, device=DEV, generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, experts, device=DEV, generator=g)
    w13_codes = torch.randint(0, 256, (experts, 2 * inter, hidden // 2), dtype=torch.uint8, device=DEV, generator=g)
    w13_scales = torch.randint(121, 125, (experts, 2 * inter, hidden // 32), dtype=torch.uint8, device=DEV, generator=g)
    w2_codes = torch.randint(0, 256, (experts, hidden, inter // 2), dtype=torch.uint8, device=DEV, generator=g)
    w2_scales = torch.randint(121, 125, (experts, hidden, inter // 32), dtype=torch.uint8, device=DEV, generator=g)
    b13 = (torch.randn(experts, 2 * inter, device=DEV, generator=g) * 0.1).to(torch.bfloat16)
    b2 = (torch.randn(experts, hidden, device=DEV, generator=g) * 0.1).to(torch.bfloat16)
    return x, logits, w13_codes, w13_scales, w2_codes, w2_scales, b13, b2


GPT_OSS_MOE = dict(activation="swiglu_clamped", gate_up_layout="interleaved")


@pytest.mark.parametrize("tokens", [1, 33, 512])
def test_moe_mxfp4_and_bf16_match_float64_and_prepared_is_bit_identical(tokens):
    x, logits, w13c, w13s, w2c, w2s, b13, b2 = moe_problem(tokens)
    w13, w2 = dequantize_mxfp4(w13c, w13s), dequantize_mxfp4(w2c, w2s)
    ref = moe_reference(x, w13, w2, logits, 4, b13.double(), b2.double())
    out = poisoned(x.shape, torch.bfloat16)
    kt.moe_apply(x, w13c, w2c, 4, out=out, router_logits=logits, w13_scale=w13s, w2_scale=w2s, w13_bias=b13, w2_bias=b2,
                 weight_format="mxfp4", **GPT_OSS_MOE)
    torch.cuda.synchronize()
    assert relative_error(out, ref) < 1e-2
    # The same weights exactly in bf16 (every MXFP4 value times its scale is a bf16 value).
    dense = torch.ops.kiln.moe_apply(x, w13.to(torch.bfloat16), w2.to(torch.bfloat16), 4, router_logits=logits,
                                     w13_bias=b13, w2_bias=b2, **GPT_OSS_MOE)
    assert relative_error(dense, ref) < 1e-2
    w13p, w2p = kt.moe_prepare_weights(w13c.clone()), kt.moe_prepare_weights(w2c.clone())
    prepared = torch.ops.kiln.moe_apply(x, w13p, w2p, 4, router_logits=logits, w13_scale=w13s, w2_scale=w2s, w13_bias=b13,
                                        w2_bias=b2, weight_format="mxfp4_prepared", **GPT_OSS_MOE)
    assert relative_error(prepared, ref) < 1e-2
    assert torch.equal(prepared, out)


@pytest.mark.parametrize("tokens", [1, 17, 300])
def test_moe_w4a8_matches_its_quantized_float64_model(tokens):
    x, logits, w13c, w13s, w2c, w2s, b13, b2 = moe_problem(tokens)
    w13, w2 = dequantize_mxfp4(w13c, w13s), dequantize_mxfp4(w2c, w2s)
    ref = moe_reference(x, w13, w2, logits, 4, b13.double(), b2.double(), w4a8=True)
    unquantized = moe_reference(x, w13, w2, logits, 4, b13.double(), b2.double())
    for weight_format, w13q, w2q in (("mxfp4", w13c, w2c),
                                     ("mxfp4_prepared", kt.moe_prepare_weights(w13c.clone()), kt.moe_prepare_weights(w2c.clone()))):
        out = poisoned(x.shape, torch.bfloat16)
        kt.moe_apply(x, w13q, w2q, 4, out=out, router_logits=logits, w13_scale=w13s, w2_scale=w2s, w13_bias=b13, w2_bias=b2,
                     weight_format=weight_format, activation_dtype="e4m3", **GPT_OSS_MOE)
        torch.cuda.synchronize()
        assert relative_error(out, ref) < 1e-2
        assert 4 * relative_error(out, ref) < relative_error(out, unquantized)  # the quantization ran
    with pytest.raises(kiln.InvalidArgumentError, match="activation_dtype: e4m3 .W4A8. needs MXFP4 weights"):
        torch.ops.kiln.moe_apply(x, w13.to(torch.bfloat16), w2.to(torch.bfloat16), 4, router_logits=logits, activation_dtype="e4m3")


# 40 tokens: past the sizes whose pairs every CTA lists itself, onto the workspace's list.
@pytest.mark.parametrize("tokens,activation_dtype", [(40, "bf16"), (512, "bf16"), (2048, "bf16"), (2048, "e4m3")])
def test_moe_is_deterministic(tokens, activation_dtype):
    x, logits, w13c, w13s, w2c, w2s, b13, b2 = moe_problem(tokens)
    runs = [torch.ops.kiln.moe_apply(x, w13c, w2c, 4, router_logits=logits, w13_scale=w13s, w2_scale=w2s, w13_bias=b13,
                                     w2_bias=b2, weight_format="mxfp4", activation_dtype=activation_dtype, **GPT_OSS_MOE)
            for _ in range(5)]
    for r in runs[1:]:
        assert torch.equal(r, runs[0])


def test_moe_with_precomputed_routing_on_a_strided_input():
    x, logits, w13c, w13s, w2c, w2s, b13, b2 = moe_problem(40)
    wide = torch.randn(40, 2 * x.shape[1], dtype=torch.bfloat16, device=DEV)
    wide[:, ::2] = x  # x seen through a view with row stride 2H and element stride 2 is refused ...
    weights, ids = torch.topk(logits, 4, dim=-1)
    weights = torch.softmax(weights, -1)
    with pytest.raises(kiln.InvalidArgumentError, match="x"):
        torch.ops.kiln.moe_apply(wide[:, ::2], w13c, w2c, 4, topk_ids=ids.int(), topk_weights=weights, w13_scale=w13s,
                                 w2_scale=w2s, weight_format="mxfp4", **GPT_OSS_MOE)
    rows = torch.randn(40, 3 * x.shape[1], dtype=torch.bfloat16, device=DEV)
    rows[:, :x.shape[1]] = x  # ... while a row-strided view is read as is
    out = torch.ops.kiln.moe_apply(rows[:, :x.shape[1]], w13c, w2c, 4, topk_ids=ids.int(), topk_weights=weights, w13_scale=w13s,
                                   w2_scale=w2s, w13_bias=b13, w2_bias=b2, weight_format="mxfp4", **GPT_OSS_MOE)
    ref = moe_reference(x, dequantize_mxfp4(w13c, w13s), dequantize_mxfp4(w2c, w2s), logits, 4, b13.double(), b2.double())
    assert relative_error(out, ref) < 1e-2


# ---- CUDA graphs ----------------------------------------------------------------------------------
def capture(step):
    """Warms `step` with kiln's prepare-only mode, captures it, returns (graph, its outputs)."""
    kt.warmup_for(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def test_decode_and_moe_replay_bit_identical_to_eager():
    q, kc, vc, table, lens = paged_problem(8, [4096, 3000, 17, 999, 4096, 1, 2048, 4000], 64, 8, 64, 16, torch.bfloat16, 1)
    sink = torch.randn(64, device=DEV)
    x, logits, w13c, w13s, w2c, w2s, b13, b2 = moe_problem(33)

    def step():
        a = torch.ops.kiln.mha_decode_with_kvcache(q, kc, vc, table, lens, sinks=sink)
        m = torch.ops.kiln.moe_apply(x, w13c, w2c, 4, router_logits=logits, w13_scale=w13s, w2_scale=w2s, w13_bias=b13,
                                     w2_bias=b2, weight_format="mxfp4", **GPT_OSS_MOE)
        return a, m

    graph, (a, m) = capture(step)
    for _ in range(3):  # new inputs each replay, as decode steps bring
        q.normal_()
        x.normal_()
        graph.replay()
        eager_a, eager_m = step()
        torch.cuda.synchronize()
        assert torch.equal(a, eager_a)
        assert torch.equal(m, eager_m)


def test_append_extend_and_speculative_decode_replay_bit_identical_to_eager():
    new, prefix = [64, 5], [1000, 300]
    q, k, v, kc, vc, table, lens, cu, nk, nv, slots = extend_problem(new, prefix, 64, 8, 64, 16, torch.bfloat16)
    qd, kd, vd, tabled, lensd = paged_problem(4, [500, 16, 3000, 77], 64, 8, 64, 1, torch.bfloat16, 16)
    sink = torch.randn(64, device=DEV)

    def step():
        torch.ops.kiln.kv_cache_append(nk, nv, slots, kc, vc)
        e = torch.ops.kiln.mha_extend_with_kvcache(q, kc, vc, table, lens, cu, max(new), sinks=sink, window_left=128)
        d = torch.ops.kiln.mha_decode_with_kvcache(qd, kd, vd, tabled, lensd, q_len=16, sinks=sink)
        return e, d

    graph, (e, d) = capture(step)
    for _ in range(3):
        q.normal_()
        nk.normal_()
        qd.normal_()
        graph.replay()
        eager_e, eager_d = step()
        torch.cuda.synchronize()
        assert torch.equal(e, eager_e)
        assert torch.equal(d, eager_d)


def test_capture_that_needs_a_compile_fails_cleanly_and_leaves_everything_usable():
    q, kc, vc, table, lens = paged_problem(2, [100, 50], 16, 16, 128, 32, torch.float16, 1)
    options = dict(softcap=17.0, window_left=33)  # a signature this process has not loaded
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(kiln.GraphCaptureError, match=r"capturing a graph.*softcap=1"):
        with torch.cuda.graph(graph):
            torch.ops.kiln.mha_decode_with_kvcache(q, kc, vc, table, lens, **options)
    # The process and the device are fine: the same call runs eagerly and is right ...
    out = torch.ops.kiln.mha_decode_with_kvcache(q, kc, vc, table, lens, **options)
    ref = decode_reference(q, kc, vc, table, lens, 1, window=33, sinks=None, softcap=17.0, scale=1 / math.sqrt(128))
    assert relative_error(out, ref) < BOUND[torch.float16]
    # ... and, now loaded, captures and replays.
    graph, captured = capture(lambda: torch.ops.kiln.mha_decode_with_kvcache(q, kc, vc, table, lens, **options))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, out)


# ---- torch.compile on the GPU ----------------------------------------------------------------------
class TwoLayers(torch.nn.Module):
    def __init__(self, experts):
        super().__init__()
        self.experts = experts

    def forward(self, x, cu, logits):
        for _ in range(2):
            t, h = x.shape
            q = x.view(t, 8, 64)
            a = kt.mha_prefill(q, q[:, :2], q[:, 2:4], cu, cu, 16, 16, causal=True, sinks=None)
            x = x + a.reshape(t, h)
            w13c, w13s, w2c, w2s, b13, b2 = self.experts
            x = x + torch.ops.kiln.moe_apply(x, w13c, w2c, 4, router_logits=logits, w13_scale=w13s, w2_scale=w2s,
                                             w13_bias=b13, w2_bias=b2, weight_format="mxfp4", **GPT_OSS_MOE)
        return x


def test_torch_compile_fullgraph_matches_eager():
    x, logits, w13c, w13s, w2c, w2s, b13, b2 = moe_problem(32)
    x = x * 0.1
    cu = torch.tensor([0, 16, 32], dtype=torch.int32, device=DEV)
    model = TwoLayers((w13c, w13s, w2c, w2s, b13, b2))
    eager = model(x, cu, logits)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)(x, cu, logits)
    torch.cuda.synchronize()
    # kiln's ops are the same kernels in both; Inductor fuses the residual adds around them and
    # keeps their intermediates in f32, so bf16 roundings differ, and two layers compound them.
    assert relative_error(compiled, eager.double()) < 2e-2
