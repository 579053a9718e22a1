"""Random GPT-OSS weights drawn on the device from a seed, so runs are repeatable without a
download. Every tensor has its own generator seeded from (seed, layer, name): a model with fewer
layers has the same first layers, and both back ends build from the same bytes.

Scales are chosen so activations stay in a trained model's range: projections have unit gain
(standard deviation 1/sqrt(fan_in)), MXFP4 codes are uniform and their e8m0 scales 2^-7 or 2^-8
(a block's values then have a standard deviation near 1/sqrt(2880)).
"""
import dataclasses
import zlib

import torch

from mxfp4 import BLOCK, E8M0_BIAS


@dataclasses.dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # f32 [H]
    qkv: torch.Tensor  # bf16 [q + 2 kv, H]
    qkv_bias: torch.Tensor  # bf16 [q + 2 kv]
    o: torch.Tensor  # bf16 [H, q]
    o_bias: torch.Tensor  # bf16 [H]
    sinks: torch.Tensor  # f32 [heads]
    mlp_norm: torch.Tensor  # f32 [H]
    router: torch.Tensor  # bf16 [E, H]
    router_bias: torch.Tensor  # bf16 [E]
    w13: torch.Tensor  # uint8 MXFP4 [E, 2I, H/2], rows gate/up interleaved
    w13_scale: torch.Tensor  # uint8 e8m0 [E, 2I, H/32]
    w13_bias: torch.Tensor  # bf16 [E, 2I]
    w2: torch.Tensor  # uint8 MXFP4 [E, H, I/2]
    w2_scale: torch.Tensor  # uint8 e8m0 [E, H, I/32]
    w2_bias: torch.Tensor  # bf16 [E, H]


@dataclasses.dataclass
class ModelWeights:
    embed: torch.Tensor  # bf16 [V, H]
    layers: list
    norm: torch.Tensor  # f32 [H]
    lm_head: torch.Tensor  # bf16 [V, H]


class _Draw:
    def __init__(self, seed, device):
        self.seed, self.device = seed, torch.device(device)

    def generator(self, layer, name):
        g = torch.Generator(device=self.device)
        g.manual_seed(zlib.crc32(f"{self.seed}/{layer}/{name}".encode()))
        return g

    def normal(self, layer, name, shape, std, mean=0.0, dtype=torch.bfloat16):
        t = torch.empty(shape, dtype=torch.float32, device=self.device)
        t.normal_(mean, std, generator=self.generator(layer, name))
        return t.to(dtype)

    def mxfp4(self, layer, name, rows_shape, k):
        packed = torch.randint(0, 256, (*rows_shape, k // 2), dtype=torch.uint8, device=self.device,
                               generator=self.generator(layer, name))
        exponents = torch.randint(-8, -6, (*rows_shape, k // BLOCK), device=self.device,
                                  generator=self.generator(layer, name + ".scale"))
        return packed, (exponents + E8M0_BIAS).to(torch.uint8)


def layer_weights(config, draw, layer):
    H, E, I = config.hidden, config.experts, config.intermediate
    qkv_rows = config.q_size + 2 * config.kv_size
    w13, w13_scale = draw.mxfp4(layer, "w13", (E, 2 * I), H)
    w2, w2_scale = draw.mxfp4(layer, "w2", (E, H), I)
    return LayerWeights(
        attn_norm=draw.normal(layer, "attn_norm", (H,), 0.05, mean=1.0, dtype=torch.float32),
        qkv=draw.normal(layer, "qkv", (qkv_rows, H), H ** -0.5),
        qkv_bias=draw.normal(layer, "qkv_bias", (qkv_rows,), 0.02),
        o=draw.normal(layer, "o", (H, config.q_size), config.q_size ** -0.5),
        o_bias=draw.normal(layer, "o_bias", (H,), 0.02),
        sinks=draw.normal(layer, "sinks", (config.heads,), 1.0, dtype=torch.float32),
        mlp_norm=draw.normal(layer, "mlp_norm", (H,), 0.05, mean=1.0, dtype=torch.float32),
        router=draw.normal(layer, "router", (E, H), H ** -0.5),
        router_bias=draw.normal(layer, "router_bias", (E,), 0.1),
        w13=w13, w13_scale=w13_scale, w13_bias=draw.normal(layer, "w13_bias", (E, 2 * I), 0.02),
        w2=w2, w2_scale=w2_scale, w2_bias=draw.normal(layer, "w2_bias", (E, H), 0.02))


def random_weights(config, seed, device="cuda"):
    """The whole model's weights for `config`, drawn on `device` from `seed`."""
    draw = _Draw(seed, device)
    return ModelWeights(
        embed=draw.normal("model", "embed", (config.vocab, config.hidden), 1.0),
        layers=[layer_weights(config, draw, i) for i in range(config.layers)],
        norm=draw.normal("model", "norm", (config.hidden,), 0.05, mean=1.0, dtype=torch.float32),
        lm_head=_unembedding(config, draw))


def _unembedding(config, draw):
    # Row norms spread log-normally (sigma 0.3), as a trained model's do (frequent tokens have larger
    # rows): the top logit stands clearer of the rest than with equal norms, and no single row wins.
    rows = draw.normal("model", "lm_head", (config.vocab, config.hidden), config.hidden ** -0.5, dtype=torch.float32)
    norms = draw.normal("model", "lm_head.norms", (config.vocab, 1), 0.3, dtype=torch.float32).exp()
    return (rows * norms).to(torch.bfloat16)
