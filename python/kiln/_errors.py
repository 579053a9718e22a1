"""kiln's errors as Python exceptions: one class per kiln_status, all subclasses of KilnError.

Every message is kiln's own and names the argument, kernel, target or file it is about.
"""


class KilnError(RuntimeError):
    """Any failure inside kiln. `code` is the kiln_status (include/kiln/kiln.h)."""

    code = 8

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgumentError(KilnError, ValueError):
    """A caller-supplied value is wrong; the message names the argument and what was expected."""
    code = 1


class UnsupportedError(KilnError):
    """Valid, but kiln does not do this on this platform."""
    code = 2


class NoKernelError(KilnError):
    """No registered kernel accepts the call's signature; the message explains each refusal."""
    code = 3


class CompileError(KilnError):
    """The run-time compiler rejected a kernel; the message carries its log."""
    code = 4


class DriverError(KilnError):
    """A driver, runtime or compiler library call failed or is missing (no GPU, out of memory)."""
    code = 5


class CacheError(KilnError):
    """The on-disk cache could not be used."""
    code = 6


class PluginError(KilnError):
    """A plugin could not be loaded or was refused."""
    code = 7


class InternalError(KilnError):
    """A bug in kiln."""
    code = 8


class GraphCaptureError(KilnError):
    """A call needed a compile or a kernel load while its stream was capturing a CUDA graph: run
    it once before capture (kiln.prepare_only() or kiln.torch.warmup_for)."""
    code = 9


_BY_CODE = {cls.code: cls for cls in (InvalidArgumentError, UnsupportedError, NoKernelError, CompileError, DriverError,
                                      CacheError, PluginError, InternalError, GraphCaptureError)}


def raise_for_status(status, message):
    cls = _BY_CODE.get(status, KilnError)
    raise cls(message or f"kiln: status {status}", status)


def invalid_argument(message):
    """An argument error found on the Python side, worded as kiln words its own."""
    return InvalidArgumentError("kiln: invalid argument: " + message, 1)
