"""GPT-OSS in PyTorch: embedding, 24 or 36 blocks of attention (sinks, a 128-token window on even
layers, YaRN rotary) and a mixture of experts, a final RMSNorm and the unembedding. Attention and
the experts come from a back end (backends.py); everything else is this file, shared by both."""
import dataclasses

import torch
import torch.nn.functional as F

from config import yarn_inv_freq


@dataclasses.dataclass
class Step:
    """One forward over the tokens of `requests` requests, each a run of new tokens that follows
    the tokens its cache slot already holds (a prompt chunk, or one decode token)."""
    tokens: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]: each token's position in its request
    token_slots: torch.Tensor  # int64 [T]: each token's cache slot
    slots: torch.Tensor  # int64 [n]: each request's cache slot
    cu_seqlens_q: torch.Tensor  # int32 [n + 1]
    seq_lens: torch.Tensor  # int32 [n]: tokens in each request's cache after this step
    max_q: int
    decode: bool  # one token per request, requests in slots 0..n-1 (a captured step)
    starts: list = None  # prefill only, on the host: tokens already cached per request
    q_lens: list = None  # prefill only, on the host

    @property
    def last_token(self):
        """Index of each request's last new token: the one its next token is sampled from."""
        return self.cu_seqlens_q[1:].long() - 1


def rms_norm(x, weight, eps):
    x32 = x.float()
    return (weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


class Rotary:
    """YaRN rotary embedding, GPT-OSS style: the two halves of each head rotate together."""

    def __init__(self, config, device):
        inv_freq, self.scale = yarn_inv_freq(config)
        self.inv_freq = inv_freq.to(device)

    def cos_sin(self, positions):
        freqs = positions.float()[:, None] * self.inv_freq
        return freqs.cos() * self.scale, freqs.sin() * self.scale

    @staticmethod
    def apply(x, cos, sin):
        first, second = x.float().chunk(2, dim=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]
        return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)


class GptOss:
    def __init__(self, config, weights, backend, device="cuda"):
        self.config, self.weights, self.backend = config, weights, backend
        self.rotary = Rotary(config, device)

    def block(self, layer, x, step, cos, sin):
        c, w = self.config, self.weights.layers[layer]
        h = rms_norm(x, w.attn_norm, c.rms_eps)
        qkv = F.linear(h, w.qkv, w.qkv_bias)
        q, k, v = qkv.split((c.q_size, c.kv_size, c.kv_size), dim=-1)
        T = x.shape[0]
        q = Rotary.apply(q.view(T, c.heads, c.head_dim), cos, sin)
        k = Rotary.apply(k.view(T, c.kv_heads, c.head_dim), cos, sin)
        attn = self.backend.attention(layer, q, k, v.reshape(T, c.kv_heads, c.head_dim).contiguous(), step)
        x = x + F.linear(attn.view(T, c.q_size), w.o, w.o_bias)
        h = rms_norm(x, w.mlp_norm, c.rms_eps)
        router_logits = F.linear(h, w.router, w.router_bias)
        return x + self.backend.experts(layer, h, router_logits)

    def logits(self, step):
        """Logits [n, V] of each request's last new token; writes the new tokens' keys and values."""
        self.backend.begin(step)
        x = self.weights.embed[step.tokens]
        cos, sin = self.rotary.cos_sin(step.positions)
        for layer in range(self.config.layers):
            x = self.block(layer, x, step, cos, sin)
        x = rms_norm(x[step.last_token], self.weights.norm, self.config.rms_eps)
        return F.linear(x, self.weights.lm_head)
