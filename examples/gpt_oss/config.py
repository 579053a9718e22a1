"""GPT-OSS's published configurations (the architecture, not the weights)."""
import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class GptOssConfig:
    name: str
    layers: int
    experts: int
    hidden: int = 2880
    intermediate: int = 2880
    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 64
    top_k: int = 4
    vocab: int = 201088
    sliding_window: int = 128  # keys a query sees on sliding layers, itself included
    rms_eps: float = 1e-5
    rope_theta: float = 150000.0
    rope_factor: float = 32.0  # YaRN
    rope_original_max: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def sliding(self, layer):
        """Even layers attend within the window, odd layers to every earlier token."""
        return layer % 2 == 0

    def with_layers(self, layers):
        if not isinstance(layers, int) or not 1 <= layers <= self.layers:
            raise ValueError(f"layers: expected 1..{self.layers} for {self.name}, got {layers!r}")
        return dataclasses.replace(self, layers=layers)

    @property
    def q_size(self):
        return self.heads * self.head_dim

    @property
    def kv_size(self):
        return self.kv_heads * self.head_dim

    def parameters(self):
        """Parameter count (MXFP4 experts counted as values, not bytes)."""
        attn = self.hidden * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden
        experts = self.experts * 3 * self.hidden * self.intermediate
        per_layer = attn + experts + self.hidden * self.experts
        return self.layers * per_layer + 2 * self.vocab * self.hidden


CONFIGS = {
    "gpt-oss-20b": GptOssConfig("gpt-oss-20b", layers=24, experts=32),
    "gpt-oss-120b": GptOssConfig("gpt-oss-120b", layers=36, experts=128),
}


def config_named(name, layers=None):
    if name not in CONFIGS:
        raise ValueError(f"model: expected one of {', '.join(CONFIGS)}, got {name!r}")
    config = CONFIGS[name]
    return config if layers is None else config.with_layers(layers)


def yarn_inv_freq(config):
    """YaRN's rotary frequencies and its attention scale, as GPT-OSS's configuration sets them
    (factor 32 over 4096 original positions, beta_fast 32, beta_slow 1, no truncation)."""
    import torch
    dim, base = config.head_dim, config.rope_theta

    def correction_dim(rotations):
        return dim * math.log(config.rope_original_max / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(correction_dim(config.rope_beta_fast), 0.0)
    high = min(correction_dim(config.rope_beta_slow), dim - 1.0)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (config.rope_factor * pos_freqs)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: high frequencies, extrapolated as they are
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq.float(), 0.1 * math.log(config.rope_factor) + 1.0
