"""The example's CPU side: arguments, weight shapes and determinism, MXFP4 packing, rotary."""
import dataclasses

import pytest
import torch

import mxfp4
import serve
from backends import ReferenceBackend, e4m3_round_trip
from config import CONFIGS, GptOssConfig, config_named, yarn_inv_freq
from model import Step
from weights import random_weights

TINY = GptOssConfig("tiny", layers=3, experts=4, hidden=64, intermediate=96, heads=4, kv_heads=2, head_dim=16, vocab=50)


def test_defaults_are_the_issue_measurement():
    args = serve.parse_args([])
    assert args.config == CONFIGS["gpt-oss-20b"]
    assert (args.prompts, args.context, args.batches, args.backends) == (8, 2048, [1, 8, 64], ["kiln", "torch"])


def test_prompt_lengths_replace_prompts_times_context():
    args = serve.parse_args(["--prompt-lengths", "300,77,1024"])
    assert args.prompts == 3 and args.prompt_lengths == [300, 77, 1024]
    assert serve.parse_args([]).prompt_lengths == [2048] * 8


def test_moe_activations_choose_w4a8_by_name():
    assert serve.parse_args([]).moe_activations == "bf16"
    assert serve.parse_args(["--moe-activations", "e4m3"]).moe_activations == "e4m3"
    with pytest.raises(SystemExit):
        serve.parse_args(["--moe-activations", "int8"])


def test_kv_cache_is_bf16_or_e4m3_with_a_positive_scale():
    args = serve.parse_args([])
    assert (args.kv_cache, args.kv_scale) == ("bf16", 1.0)
    args = serve.parse_args(["--kv-cache", "e4m3", "--kv-scale", "0.25"])
    assert (args.kv_cache, args.kv_scale) == ("e4m3", 0.25)
    with pytest.raises(SystemExit):
        serve.parse_args(["--kv-cache", "int4"])


def test_e4m3_round_trip_rounds_to_nearest_even_and_saturates():
    # What kiln's kv_cache_append stores for value / scale: e4m3's 3 mantissa bits, ties to even,
    # +-448 at most, subnormals down to 2^-9.
    scale = 0.5
    x = torch.tensor([1.0, 1.0625, 1.1875, 3.0 * 2**-10, 2**-10, 1000.0, -1000.0, 0.0]) * scale
    expected = torch.tensor([1.0, 1.0, 1.25, 2**-8, 0.0, 448.0, -448.0, 0.0], dtype=torch.float64) * scale
    assert torch.equal(e4m3_round_trip(x.bfloat16(), scale), expected)
    with pytest.raises(ValueError, match="kv_dtype"):
        ReferenceBackend(TINY, random_weights(TINY, 0, device="cpu"), slots=1, max_len=16, kv_dtype="fp8")


def test_layers_run_fewer_blocks_at_full_width():
    args = serve.parse_args(["--model", "gpt-oss-120b", "--layers", "2", "--batches", "4,16", "--backends", "kiln"])
    assert (args.config.layers, args.config.experts, args.config.hidden) == (2, 128, 2880)
    assert args.batches == [4, 16] and args.backends == ["kiln"]


@pytest.mark.parametrize("argv, named", [(["--layers", "25"], "layers"), (["--layers", "0"], "--layers"),
                                         (["--batches", "8,x"], "--batches"), (["--backends", "kiln,tpu"], "--backends"),
                                         (["--page-size", "24"], "--page-size"), (["--page-size", "512"], "--page-size"),
                                         (["--kv-scale", "0"], "--kv-scale"),
                                         (["--prompt-lengths", "8,0"], "--prompt-lengths"),
                                         (["--model", "llama"], "--model")])
def test_bad_arguments_are_named(argv, named, capsys):
    with pytest.raises((SystemExit, ValueError)) as e:
        serve.parse_args(argv)
    text = str(e.value) + capsys.readouterr().err
    assert named in text


def test_configs_match_the_published_shapes():
    small, large = config_named("gpt-oss-20b"), config_named("gpt-oss-120b")
    assert (small.layers, small.experts, large.layers, large.experts) == (24, 32, 36, 128)
    assert 20e9 < small.parameters() < 22e9 and 116e9 < large.parameters() < 118e9
    assert [small.sliding(i) for i in range(4)] == [True, False, True, False]


def test_weights_have_the_kernel_layouts_and_repeat_from_the_seed():
    w = random_weights(TINY, seed=7, device="cpu")
    E, H, I = TINY.experts, TINY.hidden, TINY.intermediate
    layer = w.layers[0]
    assert layer.w13.shape == (E, 2 * I, H // 2) and layer.w13.dtype == torch.uint8
    assert layer.w13_scale.shape == (E, 2 * I, H // 32) and layer.w2.shape == (E, H, I // 2)
    assert layer.w2_scale.shape == (E, H, I // 32) and layer.qkv.shape == (TINY.q_size + 2 * TINY.kv_size, H)
    assert layer.sinks.dtype == torch.float32 and w.lm_head.shape == (TINY.vocab, H)
    assert set(layer.w13_scale.unique().tolist()) <= {119, 120}
    again = random_weights(dataclasses.replace(TINY, layers=1), seed=7, device="cpu")
    assert torch.equal(again.layers[0].w13, layer.w13) and torch.equal(again.embed, w.embed)
    other = random_weights(TINY, seed=8, device="cpu")
    assert not torch.equal(other.layers[0].w13, layer.w13)


def test_expert_weights_have_unit_gain():
    w = random_weights(dataclasses.replace(TINY, hidden=2880, intermediate=64, experts=2, layers=1), seed=1, device="cpu")
    values = mxfp4.dequantize(w.layers[0].w13, w.layers[0].w13_scale).float()
    assert 0.6 < values.std().item() * 2880 ** 0.5 < 1.4


def test_mxfp4_pack_unpack_round_trip():
    codes = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8)
    packed = mxfp4.pack_codes(codes)
    assert packed.shape == (3, 5, 32) and torch.equal(mxfp4.unpack_codes(packed), codes)
    assert mxfp4.pack_codes(torch.tensor([1, 2], dtype=torch.uint8)).item() == 0x21  # low nibble first


def test_mxfp4_dequantize_then_quantize_is_exact():
    packed = torch.randint(0, 256, (4, 6, 32), dtype=torch.uint8)
    scales = torch.randint(100, 140, (4, 6, 2), dtype=torch.uint8)
    values = mxfp4.dequantize(packed, scales, torch.float32)
    again = mxfp4.dequantize(*mxfp4.quantize(values), torch.float32)
    assert torch.equal(again, values)


def test_mxfp4_values_and_scales():
    packed = mxfp4.pack_codes(torch.tensor([[7, 15] + [0] * 30], dtype=torch.uint8))
    values = mxfp4.dequantize(packed, torch.tensor([[127 - 3]], dtype=torch.uint8), torch.float32)
    assert values[0, :2].tolist() == [0.75, -0.75]


def test_mxfp4_refuses_mismatched_scales():
    with pytest.raises(ValueError, match="scales"):
        mxfp4.dequantize(torch.zeros((2, 16), dtype=torch.uint8), torch.zeros((2, 2), dtype=torch.uint8))


def test_yarn_matches_transformers_when_installed():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    hf = transformers.GptOssConfig()
    theirs, their_scale = ROPE_INIT_FUNCTIONS["yarn"](hf)
    ours, our_scale = yarn_inv_freq(config_named("gpt-oss-20b"))
    assert torch.allclose(theirs.float().cpu(), ours, rtol=1e-6) and abs(their_scale - our_scale) < 1e-6


def test_reference_attention_is_softmax_with_the_window_and_the_sink():
    # The parity test's float64 reference: each row's softmax over its causal keys (on sliding
    # layers the last `sliding_window` of them) with exp(sink) added to the denominator.
    config = dataclasses.replace(TINY, layers=2, sliding_window=5)
    weights = random_weights(config, 0, device="cpu")
    g = torch.Generator().manual_seed(3)
    lengths = [7, 3]
    q = torch.randn(sum(lengths), config.heads, config.head_dim, generator=g).bfloat16()
    k = torch.randn(sum(lengths), config.kv_heads, config.head_dim, generator=g).bfloat16()
    v = torch.randn(sum(lengths), config.kv_heads, config.head_dim, generator=g).bfloat16()
    cu = torch.tensor([0, 7, 10], dtype=torch.int32)
    step = Step(tokens=None, positions=None, token_slots=None, slots=torch.tensor([0, 1]), cu_seqlens_q=cu,
                seq_lens=torch.tensor(lengths, dtype=torch.int32), max_q=7, decode=False)
    group = config.heads // config.kv_heads

    def expected(rows, n, sink, window):
        qs = q[rows].double().transpose(0, 1)
        ks, vs = (t[rows].double().transpose(0, 1).repeat_interleave(group, 0) for t in (k, v))
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        scores = (qs @ ks.transpose(-1, -2) * config.head_dim ** -0.5).masked_fill((j > i) | (j <= i - window), float("-inf"))
        sinks = torch.full((config.heads, n, 1), sink, dtype=torch.float64)
        return torch.softmax(torch.cat((scores, sinks), -1), -1)[..., :-1] @ vs

    for sink in (float("-inf"), 0.5):
        for w in weights.layers:
            w.sinks.fill_(sink)
        backend = ReferenceBackend(config, weights, slots=2, max_len=16)
        for layer in range(config.layers):
            out = backend.attention(layer, q, k, v, step)
            window = config.sliding_window if config.sliding(layer) else 1 << 20
            for r, n in enumerate(lengths):
                rows = slice(int(cu[r]), int(cu[r + 1]))
                assert torch.allclose(out[rows].double().transpose(0, 1), expected(rows, n, sink, window), atol=1e-2), (sink, layer, r)
        # The window matters here: from row 5 on it hides key 0.
        assert not torch.allclose(expected(slice(0, 7), 7, sink, 5), expected(slice(0, 7), 7, sink, 1 << 20), atol=1e-2)
