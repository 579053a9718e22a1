"""Parity of the two back ends on a 2-layer full-width GPT-OSS-20B (needs a GPU and kiln).

Stated tolerance. The back ends round differently in bf16 (attention's probabilities, the expert
GEMMs' outputs): per position the logits differ by about 1% of their standard deviation. With
random weights two things make top-1 tokens differ beyond that: near-ties among 201088 roughly
Gaussian logits, and router near-ties, where a rounding difference picks another expert for one
token. Neither is a defect (kiln against itself, chunked against unchunked prefill, agrees on
98.5% of positions on 2026-11-27), so top-1 agreement is required on the positions that are not
ties (top-2 gap above TIE standard deviations), and overall agreement has a floor. The PyTorch
side computes the experts' activation in f32 here: its default, bf16 as Transformers computes it,
adds a rounding of its own (decisive agreement 98.4% with it, 99.2% without, on 2026-11-27).
"""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MEDIAN_RMS = 0.02  # per position, of the logits' standard deviation
TIE = 0.05
DECISIVE_AGREEMENT = 0.99
AGREEMENT_FLOOR = 0.95


def test_kiln_and_pytorch_agree_under_teacher_forcing():
    pytest.importorskip("kiln")
    import serve
    from config import config_named
    config = config_named("gpt-oss-20b", layers=2)
    g = torch.Generator().manual_seed(11)
    lengths = [300, 77, 129, 1024]  # past the 128-token window; kiln's in chunks of 256 tokens a forward
    prompts = [torch.randint(0, config.vocab, (n,), generator=g) for n in lengths]
    forced = torch.randint(0, config.vocab, (64, len(lengths)), generator=g).cuda()
    kiln_logits = serve.teacher_forced_logits("kiln", config, 5, prompts, forced, max_batched_tokens=256).float()
    torch.cuda.empty_cache()
    torch_logits = serve.teacher_forced_logits("torch", config, 5, prompts, forced, activation_dtype=torch.float32).float()
    assert torch.isfinite(kiln_logits).all() and torch.isfinite(torch_logits).all()
    scale = torch_logits.std()
    same = kiln_logits.argmax(-1) == torch_logits.argmax(-1)
    top2 = torch_logits.topk(2, dim=-1).values
    decisive = (top2[..., 0] - top2[..., 1]) / scale > TIE
    per_position = (kiln_logits - torch_logits).pow(2).mean(-1).sqrt() / scale
    figures = dict(agreement=same.float().mean().item(), decisive_positions=decisive.float().mean().item(),
                   decisive_agreement=same[decisive].float().mean().item(), median_rms=per_position.median().item(),
                   max_rms=per_position.max().item())
    print("kiln against PyTorch, 4 requests x 65 positions:", {k: round(v, 4) for k, v in figures.items()})
    # Where decisive positions disagree: PyTorch's top-2 gap and the position's RMS, both in logit
    # standard deviations (a router near-tie shows as a large RMS at a single position).
    wrong = decisive & ~same
    gaps = (top2[..., 0] - top2[..., 1]) / scale
    print("decisive disagreements (top-2 gap, rms):", [(round(g, 3), round(r, 3)) for g, r in zip(gaps[wrong].tolist(), per_position[wrong].tolist())])
    assert figures["median_rms"] <= MEDIAN_RMS
    assert figures["decisive_agreement"] >= DECISIVE_AGREEMENT
    assert figures["agreement"] >= AGREEMENT_FLOOR
