"""The installed package on any machine: import, versions, argument errors, fake implementations,
torch.compile tracing, the registry and a real warm-up through NVRTC. No GPU needed."""
import json
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

import kiln
import kiln.torch as kt

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_version_matches_the_library():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake_version = re.search(r"project\(kiln VERSION ([0-9.]+)", f.read()).group(1)
    assert kiln.__version__ == cmake_version
    from importlib.metadata import version
    assert version("kiln") == cmake_version


def test_import_registers_torch_ops_without_importing_kiln_torch_first():
    code = "import kiln, torch; print(kiln.__version__, torch.ops.kiln.mha_prefill)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == kiln.__version__
    assert "kiln.mha_prefill" in out


def test_package_is_the_installed_one_with_its_own_library():
    here = os.path.dirname(kiln.__file__)
    assert os.path.exists(os.path.join(here, "lib", "libkiln.so"))
    assert os.path.exists(os.path.join(here, "libexec", "kiln", "kiln-compile-worker"))


def test_command_line_runs_from_the_package():
    out = subprocess.run([sys.executable, "-m", "kiln", "list", "--json"], capture_output=True, text=True, check=True).stdout
    listed = json.loads(out)
    assert listed["schema"] == 1
    names = {k["name"] for k in listed["kernels"]}
    assert "attention.prefill.wgmma_ws" in names


# ---- argument errors ------------------------------------------------------------------------------
def prefill_inputs(dtype=torch.bfloat16, device="cpu"):
    q = torch.randn(16, 8, 64, dtype=dtype, device=device)
    k = torch.randn(16, 2, 64, dtype=dtype, device=device)
    cu = torch.tensor([0, 16], dtype=torch.int32, device=device)
    return q, k, k.clone(), cu, cu.clone(), 16, 16


def test_wrong_dtype_names_the_argument():
    q, k, v, cq, ck, mq, mk = prefill_inputs()
    with pytest.raises(kiln.InvalidArgumentError, match=r"\bk: expected dtype bf16 or f16, got f32"):
        torch.ops.kiln.mha_prefill(q, k.float(), v, cq, ck, mq, mk)
    with pytest.raises(kiln.InvalidArgumentError, match="cu_seqlens_q"):
        torch.ops.kiln.mha_prefill(q, k, v, cq.long(), ck, mq, mk)


def test_host_memory_is_refused_by_name():
    with pytest.raises(kiln.InvalidArgumentError, match="q: must be in device memory"):
        torch.ops.kiln.mha_prefill(*prefill_inputs())


def test_invalid_argument_is_also_a_value_error():
    with pytest.raises(ValueError):
        torch.ops.kiln.mha_prefill(*prefill_inputs())


@pytest.mark.parametrize("option, value, name", [("softmax_scale", 0.0, "softmax_scale"), ("softcap", -1.0, "softcap"),
                                                 ("window_left", -1, "window_left")])
def test_unset_options_are_none_and_sentinels_are_refused(option, value, name):
    with pytest.raises(kiln.InvalidArgumentError, match=name):
        torch.ops.kiln.mha_prefill(*prefill_inputs(), **{option: value})


def test_moe_choices_are_checked_by_name():
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    w13 = torch.randn(2, 256, 128, dtype=torch.bfloat16)
    w2 = torch.randn(2, 128, 128, dtype=torch.bfloat16)
    logits = torch.randn(4, 2)
    for option, value in [("routing", "bogus"), ("activation", "relu"), ("gate_up_layout", "diagonal"),
                          ("weight_format", "int3"), ("activation_dtype", "e5m2")]:
        with pytest.raises(kiln.InvalidArgumentError, match=option):
            torch.ops.kiln.moe_apply(x, w13, w2, 1, router_logits=logits, **{option: value})


def test_decode_k_scale_must_be_positive():
    q = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    cache = torch.randn(4, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(2, 2, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    with pytest.raises(kiln.InvalidArgumentError, match="k_scale"):
        torch.ops.kiln.mha_decode_with_kvcache(q, cache, cache, table, lens, k_scale=0.0)


# ---- the framework-neutral core over array protocols ----------------------------------------------
class CudaArray:
    """Device memory described only by __cuda_array_interface__ (never dereferenced here)."""

    def __init__(self, shape, typestr, address=1 << 32, strides=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (address, False),
                                         "strides": strides, "version": 3}


class DLPackOnly:
    """A tensor seen only through DLPack."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__()

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


def test_dlpack_descriptors_match_torchs_own_for_strided_views():
    from kiln import _tensors
    base = torch.randn(6, 10, 64, dtype=torch.bfloat16)
    view = base[1:5, 2:8]  # strided in the first two dimensions
    via_dlpack, _ = _tensors.descriptor(DLPackOnly(view), "q")
    direct, _ = _tensors.descriptor(view, "q")
    assert via_dlpack == direct
    assert via_dlpack[2] == 3 and via_dlpack[3:6] == (4, 6, 64) and via_dlpack[9:12] == (640, 64, 1)


def test_neutral_api_reads_cuda_array_interface_and_checks_shapes():
    q = kiln.typed(CudaArray((16, 8, 64), "<V2"), "bf16")
    k = kiln.typed(CudaArray((16, 2, 64, 1), "<V2"), "bf16")  # one dimension too many
    out = kiln.typed(CudaArray((16, 8, 64), "<V2"), "bf16")
    cu = CudaArray((2,), "<i4")
    with pytest.raises(kiln.InvalidArgumentError, match=r"\bk: expected rank 3, got 4"):
        kiln.mha_prefill(q, k, k, out, cu, cu, 16, 16)


def test_neutral_api_names_what_it_cannot_read():
    with pytest.raises(kiln.InvalidArgumentError, match="v: a list is no array"):
        kiln.mha_prefill(torch.zeros(1), torch.zeros(1), [1, 2], torch.zeros(1), torch.zeros(1), torch.zeros(1), 1, 1)
    with pytest.raises(kiln.InvalidArgumentError, match="typestr"):
        kiln.mha_prefill(CudaArray((16, 8, 64), "<V2"), None, None, None, None, None, 1, 1)
    with pytest.raises(kiln.InvalidArgumentError, match="stream"):
        kiln.mha_prefill(*prefill_inputs()[:3], None, None, None, 1, 1, stream="default")


def test_mxfp4_marking_needs_bytes():
    with pytest.raises(kiln.InvalidArgumentError, match="weights: .*uint8"):
        kiln.moe_prepare_weights(torch.zeros(4, 16, dtype=torch.int32))
    with pytest.raises(kiln.InvalidArgumentError, match="w13: .*uint8"):
        torch.ops.kiln.moe_apply(torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(2, 64, 32, dtype=torch.bfloat16),
                                 torch.zeros(2, 64, 16, dtype=torch.uint8), 1, weight_format="mxfp4")


def test_prepare_only_must_be_balanced():
    from kiln import _capi
    with pytest.raises(kiln.InvalidArgumentError, match="enter"):
        _capi.check(_capi.lib.kiln_prepare_only(0))
    with kiln.prepare_only():
        with kiln.prepare_only():
            pass


# ---- fake implementations and torch.compile ---------------------------------------------------------
def meta(*tensors):
    return [t.to("meta") if isinstance(t, torch.Tensor) else t for t in tensors]


def test_fake_implementations_give_shapes_and_dtypes():
    q, k, v, cq, ck, mq, mk = meta(*prefill_inputs())
    out = torch.ops.kiln.mha_prefill(q, k, v, cq, ck, mq, mk)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "meta"
    out, lse = torch.ops.kiln.mha_prefill_lse(q, k, v, cq, ck, mq, mk)
    assert lse.shape == (16, 8) and lse.dtype == torch.float32
    cache = torch.empty(4, 16, 2, 64, dtype=torch.float16, device="meta")
    qd = torch.empty(6, 8, 64, dtype=torch.float16, device="meta")
    table = torch.empty(2, 2, dtype=torch.int32, device="meta")
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    out, lse = torch.ops.kiln.mha_decode_with_kvcache_lse(qd, cache, cache, table, lens, q_len=3)
    assert out.shape == (6, 8, 64) and out.dtype == torch.float16 and lse.shape == (6, 8)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out, lse = torch.ops.kiln.mha_extend_with_kvcache_lse(qd, cache, cache, table, lens, cu, 3)
    assert out.shape == (6, 8, 64) and out.dtype == torch.float16 and lse.shape == (6, 8)
    assert torch.ops.kiln.kv_cache_append(qd[:, :2], qd[:, 2:4], lens.long(), cache, cache) is None
    x = torch.empty(5, 128, dtype=torch.bfloat16, device="meta")
    w13 = torch.empty(4, 256, 64, dtype=torch.uint8, device="meta")
    w2 = torch.empty(4, 128, 64, dtype=torch.uint8, device="meta")
    y = torch.ops.kiln.moe_apply(x, w13, w2, 2, topk_ids=torch.empty(5, 2, dtype=torch.int32, device="meta"),
                                 topk_weights=torch.empty(5, 2, device="meta"), weight_format="mxfp4")
    assert y.shape == x.shape and y.dtype == torch.bfloat16


class AttentionMoe(torch.nn.Module):
    def forward(self, q, k, v, cu, cache, table, lens, x, w13, w2, logits, out):
        a = kt.mha_prefill(q, k, v, cu, cu, 16, 16, causal=True, window_left=8)
        a2, lse = kt.mha_prefill(q, k, v, cu, cu, 16, 16, return_lse=True)
        kt.mha_prefill(q, k, v, cu, cu, 16, 16, out=out)
        d = kt.mha_decode_with_kvcache(q[:2], cache, cache, table, lens)
        kt.mha_decode_with_kvcache(q[:2], cache, cache, table, lens, out=out[:2])
        kt.kv_cache_append(k, v, lens.long(), cache, cache)
        e, e_lse = kt.mha_extend_with_kvcache(q, cache, cache, table, lens, cu, 16, return_lse=True, window_left=4)
        y = kt.moe_apply(x, w13, w2, 2, router_logits=logits, activation="swiglu_clamped", gate_up_layout="interleaved")
        y2 = kt.moe_apply(x, w13, w2, 2, router_logits=logits, out=torch.empty_like(x))
        return a + a2 + out + lse.sum() + e + e_lse.sum(), d.sum() + y.sum() + y2.sum()


def compile_inputs():
    q, k, v, cu, _, _, _ = prefill_inputs()
    cache = torch.randn(4, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(2, 2, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    x = torch.randn(16, 128, dtype=torch.bfloat16)
    w13 = torch.randn(4, 256, 128, dtype=torch.bfloat16)
    w2 = torch.randn(4, 128, 128, dtype=torch.bfloat16)
    logits = torch.randn(16, 4)
    return meta(q, k, v, cu, cache, table, lens, x, w13, w2, logits, torch.empty_like(q))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_traces_every_op(backend):
    torch._dynamo.reset()
    compiled = torch.compile(AttentionMoe(), fullgraph=True, backend=backend)
    a, b = compiled(*compile_inputs())
    assert a.shape == (16, 8, 64) and b.shape == ()


def test_no_graph_breaks():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(AttentionMoe())(*compile_inputs())
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


# ---- registry, cache, warm-up, logging ------------------------------------------------------------
def test_list_and_explain():
    names = {k["name"] for k in kiln.list_kernels()}
    assert {"attention.prefill.wgmma_ws", "moe.apply.stream"} <= names
    sig = "dtype=bf16,head_dim=64,group=8,causal=true,window=true,sinks=true,softcap=false,lse=false"
    ex = kiln.explain("mha_prefill", sig, target="sm_90a")
    assert ex["selected"].startswith("attention.prefill.")
    refused = kiln.explain("mha_prefill", sig.replace("dtype=bf16", "dtype=f32"), target="sm_90a")
    assert refused["selected"] is None  # a valid signature no kernel takes
    assert any("dtype f32 unsupported" in c["reason"] for c in refused["candidates"])
    for bad, named in (("dtype=bf17", "dtype=bf17: expected one of"), ("dtype=bf16", "missing key 'head_dim'"),
                       (sig.replace("group=8", "group=0"), "group=0"), (sig + ",bogus=1", "unknown key 'bogus'")):
        with pytest.raises(kiln.InvalidArgumentError, match=named):
            kiln.explain("mha_prefill", bad, target="sm_90a")
    with pytest.raises(kiln.InvalidArgumentError, match="mha_nothing"):
        kiln.explain("mha_nothing", sig, target="sm_90a")


def decode_manifest(tmp_path, head_dim):
    # A signature no other test in this pytest run uses, so its first warm-up compiles.
    manifest = tmp_path / f"decode{head_dim}.json"
    manifest.write_text(json.dumps({"kiln_manifest": 1, "model": "one", "operators": [{"op": "mha_decode_with_kvcache", "signature": {
        "dtype": "f16", "kv_dtype": "f16", "head_dim": head_dim, "group": 3, "page_size": 128, "q_len": 2, "window": True,
        "sinks": True, "softcap": True, "lse": True}}]}))
    return str(manifest)


def test_warmup_compiles_through_nvrtc_logs_to_a_callback_and_the_second_run_hits(tmp_path):
    seen = []
    kiln.set_log_callback(lambda level, message: seen.append((level, message)))
    kiln.set_log_level(logging.INFO)
    try:
        first = kiln.warmup(decode_manifest(tmp_path, 64), "sm_90a")
    finally:
        kiln.set_log_level(logging.WARNING)
        kiln.set_log_callback(kiln.log_to_python)
    assert first["failed"] == 0, first
    assert first["compiled"] == 1, first
    assert any(level == logging.INFO and message.startswith("compiled ") for level, message in seen), seen
    second = kiln.warmup(decode_manifest(tmp_path, 64), ["sm_90a"])
    assert second["cached"] + second["shared"] == 1 and second["compiled"] == 0
    stats = kiln.cache_stats()
    assert stats["persistent"] and stats["entries"] >= 1 and stats["compiles"] >= 1
    with pytest.raises(kiln.InvalidArgumentError, match="target"):
        kiln.warmup(decode_manifest(tmp_path, 64), "sm_13")


def test_with_the_jit_off_a_miss_names_the_warmup_that_fixes_it(tmp_path):
    kiln.set_jit(False)
    try:
        report = kiln.warmup(decode_manifest(tmp_path, 128), "sm_80")  # a signature no test here compiled
    finally:
        kiln.set_jit(True)
    assert report["failed"] == 1, report
    reason = report["items"][0]["reason"]
    assert "compiling is off (KILN_JIT=off)" in reason and "warmup --op mha_decode_with_kvcache" in reason, reason


def test_log_messages_reach_python_logging_by_default(tmp_path, caplog):
    kiln.set_log_level(logging.INFO)
    try:
        with caplog.at_level(logging.INFO, logger="kiln"):
            report = kiln.warmup(decode_manifest(tmp_path, 128), "sm_90a")
    finally:
        kiln.set_log_level(logging.WARNING)
    assert report["compiled"] == 1, report
    assert any(r.name == "kiln" and r.getMessage().startswith("compiled ") for r in caplog.records)
