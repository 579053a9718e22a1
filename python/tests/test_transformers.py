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
# The reference is the same model in float32 on Transformers' eager path. kiln (bf16) must be as
# close to it as Transformers' own bf16 eager path is, within these factors.
CLOSENESS = 1.5
FLOOR = 0.01  # relative rms below which both are simply right
TIE = 0.05  # a greedy choice this close (times the logits' std) to float32's best is a tie


def _model(seed=0):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = transformers.GptOssForCausalLM._from_config(_config(), dtype=torch.bfloat16)
    return model.eval()


def _relative_rms(ours, reference):
    return ((ours.float() - reference).pow(2).mean().sqrt() / reference.std()).item()


def _set(model, attention, experts):
    model.set_attn_implementation(attention)
    model.set_experts_implementation(experts)


def _float32_logits(model, ids, mask=None):
    _set(model, "eager", "eager")
    model.float()
    logits = model(ids, attention_mask=mask).logits.float()
    model.to(torch.bfloat16)
    return logits


@pytest.mark.gpu
@torch.inference_mode()
def test_logits_are_as_close_to_float32_as_transformers_own_bf16_with_and_without_padding():
    model = _model()
    ids = torch.randint(0, 201088, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :37] = 0  # left padding: the second prompt is 263 tokens long
    reference, reference_padded = _float32_logits(model, ids), _float32_logits(model, ids, mask)[1, 37:]
    _set(model, "eager", "eager")
    eager, eager_padded = model(ids).logits, model(ids, attention_mask=mask).logits[1, 37:]
    kiln_hf.enable(model)
    ours, ours_padded = model(ids).logits, model(ids, attention_mask=mask).logits[1, 37:]
    figures = {name: (_relative_rms(x, ref), (x.argmax(-1) == ref.argmax(-1)).float().mean().item())
               for name, x, ref in (("eager", eager, reference), ("kiln", ours, reference),
                                    ("eager padded", eager_padded, reference_padded), ("kiln padded", ours_padded, reference_padded))}
    print("relative rms and top-1 agreement against float32:", figures)
    assert torch.isfinite(ours).all() and torch.isfinite(ours_padded).all()
    assert figures["kiln"][0] <= max(CLOSENESS * figures["eager"][0], FLOOR)
    assert figures["kiln padded"][0] <= max(CLOSENESS * figures["eager padded"][0], FLOOR)


def _worst_margin(model, sequence, prompt_len):
    """How far each greedy choice after the prompt falls below float32's best, in logits' std."""
    logits = _float32_logits(model, sequence)[0, prompt_len - 1:-1]
    chosen = logits.gather(1, sequence[0, prompt_len:, None]).squeeze(1)
    return ((logits.max(1).values - chosen) / logits.std()).max().item()


@pytest.mark.gpu
@torch.inference_mode()
def test_generate_chooses_as_transformers_own_bf16_does():
    model = _model(seed=2)
    ids = torch.randint(0, 201088, (1, 200), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    kiln_hf.enable(model)
    ours = model.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)
    _set(model, "eager", "eager")
    theirs = model.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)
    ours_margin, their_margin = _worst_margin(model, ours, ids.shape[1]), _worst_margin(model, theirs, ids.shape[1])
    print(f"transformers {transformers.__version__}: generate: identical {bool((ours == theirs).all())}, worst margin below float32's choice: kiln {ours_margin:.4f}, "
          f"eager bf16 {their_margin:.4f}")
    assert ours.shape == (1, 216)
    assert ours_margin <= max(their_margin, TIE)
