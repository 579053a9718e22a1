"""kiln: attention and mixture-of-experts kernels for LLM serving, compiled for the GPU it finds.

The operators here take any array that speaks DLPack, __cuda_array_interface__ or
__array_interface__ (outputs included: the caller allocates them) and a stream handle. PyTorch
users import kiln.torch for torch.ops.kiln.*, which allocate outputs, use the current stream and
work under torch.compile and CUDA graphs. Semantics of every argument: include/kiln/ops.hpp.
"""
import atexit
import contextlib
import importlib.util as _importlib_util
import os as _os
import json
import logging

from . import _capi
from ._errors import (CacheError, CompileError, DriverError, GraphCaptureError, InternalError, InvalidArgumentError, KilnError,
                      NoKernelError, PluginError, UnsupportedError, invalid_argument)
from ._tensors import typed

__version__ = _capi.lib.kiln_version().decode()

__all__ = ["__version__", "mha_prefill", "mha_decode_with_kvcache", "mha_extend_with_kvcache", "kv_cache_append", "moe_apply", "moe_prepare_weights", "explain", "list_kernels",
           "cache_stats", "warmup", "set_jit", "set_log_callback", "set_log_level", "log_to_python", "set_override", "load_plugin", "prepare_only", "typed", "KilnError",
           "InvalidArgumentError", "UnsupportedError", "NoKernelError", "CompileError", "DriverError", "CacheError", "PluginError",
           "InternalError", "GraphCaptureError"]

from ._ops import (kv_cache_append, mha_decode_with_kvcache, mha_extend_with_kvcache, mha_prefill, moe_apply,  # noqa: E402
                   moe_prepare_weights)


def list_kernels():
    """Every registered kernel: name, operator, priority, backend, vendor, origin."""
    return json.loads(_capi.call_json(_capi.lib.kiln_list_kernels_json))


def explain(op, signature, target=None):
    """Why each kernel accepts or refuses a signature ("key=value,...") on `target` (e.g.
    "sm_90a"; None: this machine's first GPU), and which one is selected."""
    return json.loads(_capi.call_json(_capi.lib.kiln_explain_json, _capi.encode(op), _capi.encode(signature),
                                      _capi.encode(target)))


def cache_stats():
    """This process's kernel cache: directory, whether it persists, entries, and hit counters."""
    return json.loads(_capi.call_json(_capi.lib.kiln_cache_stats_json))


def warmup(manifest, target, jobs=0):
    """Compiles (or finds in the cache) every signature of `manifest` (a built-in model name such
    as "gpt-oss-120b", or a manifest file) for `target` (a name or a list, e.g. "sm_90a"). Needs no
    GPU. Returns the report; items that failed are listed in it, not raised."""
    targets = target if isinstance(target, str) else ",".join(target)
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 0:
        raise invalid_argument(f"jobs: expected an int >= 0 (0: one per core), got {jobs!r}")
    return json.loads(_capi.call_json(_capi.lib.kiln_warmup_json, _capi.encode(manifest), _capi.encode(targets), jobs))


def set_override(op, kernel):
    """Forces `kernel` for operator `op`; None clears it."""
    _capi.check(_capi.lib.kiln_set_override(_capi.encode(op), _capi.encode(kernel)))


def load_plugin(path):
    _capi.check(_capi.lib.kiln_load_plugin(_capi.encode(path)))


@contextlib.contextmanager
def prepare_only():
    """Operator calls on this thread inside the block select, compile and load their kernels but
    launch nothing: run one step of a model under it before capturing that step in a CUDA graph."""
    _capi.check(_capi.lib.kiln_prepare_only(1))
    try:
        yield
    finally:
        _capi.check(_capi.lib.kiln_prepare_only(0))


# ---- logging ---------------------------------------------------------------------------------------
_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}
_log_callback = None  # the ctypes callback kiln holds; kept alive here


def set_log_callback(callback):
    """Routes kiln's messages to `callback(level, message)` (level: a logging level), from any
    thread; None writes them to stderr. By default they go to the Python logger "kiln"."""
    global _log_callback
    if callback is None:
        _capi.check(_capi.lib.kiln_set_log_callback(None, None))
        _log_callback = None
        return

    def forward(level, message, _user):
        try:
            callback(_LEVELS.get(level, logging.ERROR), message.decode("utf-8", "replace"))
        except Exception:  # a failing callback must not unwind into kiln
            logging.getLogger("kiln").exception("kiln log callback failed")

    c_callback = _capi.LOG_CALLBACK(forward)
    _capi.check(_capi.lib.kiln_set_log_callback(c_callback, None))
    _log_callback = c_callback


def set_jit(enabled):
    """enabled=False: compiler-free serving, as KILN_JIT=off. Kernels come from the cache and its
    seeds only, no compiler library is loaded, and a miss raises NoKernelError naming the
    `kiln warmup` command that stores the kernel. True (the default) compiles on a miss."""
    _capi.check(_capi.lib.kiln_set_jit(1 if enabled else 0))


def set_log_level(level):
    """The least severe kiln message passed on, as a logging level (default WARNING, or KILN_LOG)."""
    if level <= logging.DEBUG:
        code = 0
    elif level <= logging.INFO:
        code = 1
    elif level <= logging.WARNING:
        code = 2
    elif level <= logging.ERROR:
        code = 3
    else:
        code = 4
    _capi.check(_capi.lib.kiln_set_log_level(code))


def log_to_python(level, message):
    """The default log callback: the Python logger "kiln"."""
    logging.getLogger("kiln").log(level, message)


set_log_callback(log_to_python)
# PyTorch users get torch.ops.kiln.* from `import kiln` alone (KILN_TORCH=0 skips it).
if _os.environ.get("KILN_TORCH", "1") != "0" and _importlib_util.find_spec("torch") is not None:
    from . import torch as _torch_ops  # noqa: E402,F401

# Threads of kiln may log after the interpreter starts tearing down: detach Python first.
atexit.register(lambda: _capi.lib.kiln_set_log_callback(None, None))
