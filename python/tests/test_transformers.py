"""kiln.integrations.transformers: Transformers' GPT-OSS on kiln's attention and experts."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kiln  # noqa: E402
import kiln.integrations.transformers as kiln_hf  # noqa: E402


def _config(layers=2, **overrides):
    """GPT-OSS-20B's widths with `layers` layers (random initialisation, nothing downloaded)."""
    values = dict(num_hidden_layers=layers, num_local_experts=32, vocab_size=201088, layer_types=None)
    values.update(overrides)
    return transformers.GptOssConfig(**values)


def _tiny():
    return _config(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   num_local_experts=4, vocab_size=100)


def test_register_adds_kiln_to_every_interface():
    assert kiln_hf.register() is True
    from transformers import AttentionInterface
    from transformers.integrations.moe import ExpertsInterface
    from transformers.masking_utils import AttentionMaskInterface
    assert "kiln" in AttentionInterface._global_mapping and "kiln" in AttentionMaskInterface._global_mapping
    assert "kiln" in ExpertsInterface._global_mapping


def test_enable_rewrites_expert_weights_in_place_keeping_values():
    model = transformers.GptOssForCausalLM(_tiny())
    experts = model.model.layers[0].mlp.experts
    before = experts.gate_up_proj.detach().clone(), experts.down_proj.detach().clone()
    kiln_hf.enable(model)
    assert model.config._attn_implementation == "kiln" and model.config._experts_implementation == "kiln"
    assert torch.equal(experts.gate_up_proj, before[0]) and torch.equal(experts.down_proj, before[1])
    assert experts.gate_up_proj.transpose(1, 2).is_contiguous() and experts.down_proj.transpose(1, 2).is_contiguous()


def test_other_activations_are_refused_by_name():
    model = transformers.GptOssForCausalLM(_tiny())
    model.model.layers[0].mlp.experts.alpha = 1.5
    with pytest.raises(kiln.UnsupportedError, match="alpha"):
        kiln_hf.enable(model)


def test_a_mask_of_the_wrong_shape_is_named():
    q = torch.zeros((1, 4, 3, 16))
    with pytest.raises(kiln.InvalidArgumentError, match="attention_mask"):
        kiln_hf.attention(None, q, q[:, :2], q[:, :2], torch.ones((1, 1, 3, 3)))


def test_dropout_is_refused():
    q = torch.zeros((1, 4, 3, 16))
    with pytest.raises(kiln.InvalidArgumentError, match="dropout"):
        kiln_hf.attention(None, q, q[:, :2], q[:, :2], None, dropout=0.1)


# ---- on a GPU ------------------------------------------------------------------------------------
LOGIT_RMS = 0.03  # of the logits' standard deviation: eager rounds scores and probabilities to bf16
TIE = 0.1  # a token within this (times the logits' std) of eager's best is a tie, not a disagreement


def _model(seed=0):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = transformers.GptOssForCausalLM._from_config(_config(), dtype=torch.bfloat16)
    return model.eval()


def _relative_rms(ours, theirs):
    return ((ours.float() - theirs.float()).pow(2).mean().sqrt() / theirs.float().std()).item()


def _set(model, attention, experts):
    model.set_attn_implementation(attention)
    model.set_experts_implementation(experts)


@pytest.mark.gpu
@torch.inference_mode()
def test_logits_match_transformers_eager_with_and_without_padding():
    model = _model()
    ids = torch.randint(0, 201088, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :37] = 0  # left padding: the second prompt is 263 tokens long
    _set(model, "eager", "eager")
    eager = model(ids).logits
    eager_padded = model(ids, attention_mask=mask).logits
    kiln_hf.enable(model)
    ours = model(ids).logits
    ours_padded = model(ids, attention_mask=mask).logits
    rms, rms_padded = _relative_rms(ours, eager), _relative_rms(ours_padded[1, 37:], eager_padded[1, 37:])
    print(f"logits rms vs eager: {rms:.4f}, padded {rms_padded:.4f}")
    assert rms <= LOGIT_RMS and rms_padded <= LOGIT_RMS
    assert torch.isfinite(ours_padded).all()


@pytest.mark.gpu
@torch.inference_mode()
def test_generate_gives_eagers_greedy_tokens():
    model = _model(seed=2)
    ids = torch.randint(0, 201088, (1, 200), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    kiln_hf.enable(model)
    ours = model.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)
    _set(model, "eager", "eager")
    theirs = model.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)
    # Where the two differ, eager's own logits over kiln's sequence must call it a near-tie.
    logits = model(ours).logits[0, ids.shape[1] - 1:-1].float()
    chosen = logits.gather(1, ours[0, ids.shape[1]:, None]).squeeze(1)
    margin = (logits.max(1).values - chosen) / logits.std()
    same = (ours == theirs).all().item()
    print(f"generate: identical {same}, worst margin {margin.max().item():.4f}")
    assert ours.shape == (1, 216) and margin.max().item() <= TIE
