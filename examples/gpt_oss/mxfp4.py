"""MXFP4 (OCP MX) as GPT-OSS ships its experts: two e2m1 codes per byte, low nibble first, and one
e8m0 power-of-two scale per 32 consecutive values along the reduction dimension."""
import torch

BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E8M0_BIAS = 127


def _table(device):
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def unpack_codes(packed):
    """uint8 [..., K/2] -> the e2m1 codes [..., K] (uint8, 0..15)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed: expected uint8 MXFP4 bytes, got {packed.dtype}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def pack_codes(codes):
    """e2m1 codes [..., K] (K even, 0..15) -> uint8 [..., K/2], low nibble first."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: the last dimension must be even, got {codes.shape[-1]}")
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def dequantize(packed, scales, dtype=torch.bfloat16):
    """packed uint8 [..., K/2] and e8m0 scales uint8 [..., K/32] -> values [..., K]. Exact in bf16:
    every e2m1 value times a power of two is a bf16 where the exponent fits."""
    k = packed.shape[-1] * 2
    if scales.shape[:-1] != packed.shape[:-1] or scales.shape[-1] * BLOCK != k:
        raise ValueError(f"scales: expected shape {(*packed.shape[:-1], k // BLOCK)}, got {tuple(scales.shape)}")
    values = _table(packed.device)[unpack_codes(packed).long()]
    powers = torch.exp2(scales.float() - E8M0_BIAS)
    return (values.unflatten(-1, (-1, BLOCK)) * powers.unsqueeze(-1)).flatten(-2).to(dtype)


def quantize(values):
    """values [..., K] (K a multiple of 32) -> (packed, scales): each block's scale is the power of
    two that puts its largest magnitude at or under 6, codes round to the nearest e2m1 value."""
    if values.shape[-1] % BLOCK:
        raise ValueError(f"values: the last dimension must be a multiple of {BLOCK}, got {values.shape[-1]}")
    blocks = values.float().unflatten(-1, (-1, BLOCK))
    amax = blocks.abs().amax(-1).clamp_min(2.0 ** -126)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = blocks / torch.exp2(exponent).unsqueeze(-1)
    magnitudes = _table(values.device)[:8]
    nearest = (scaled.abs().unsqueeze(-1) - magnitudes).abs().argmin(-1)
    codes = nearest | ((scaled < 0) & (nearest > 0)).to(nearest.dtype) << 3
    return pack_codes(codes.flatten(-2)), (exponent + E8M0_BIAS).to(torch.uint8)
