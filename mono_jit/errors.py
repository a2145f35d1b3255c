"""The exceptions mono-jit raises: one base class so callers can catch the family."""


class MonoJitError(Exception):
    """Base of every error mono-jit raises on purpose."""


class SpecError(MonoJitError, ValueError):
    """A Spec field or a deployment-grid argument is out of range."""


class TemplateError(MonoJitError):
    """A template class or its answers for a spec break the template contract (docs/plugins.md)."""


class ToolchainError(MonoJitError):
    """FlyDSL, ld.lld or the device bitcode is missing or unusable."""


class CompileError(MonoJitError):
    """A template failed to compile (FlyDSL error, crash, timeout or bad code object)."""


class ResourceError(CompileError):
    """A compiled kernel exceeds its register, LDS, scratch or residency budget."""


class InvalidCodeObject(MonoJitError):
    """Bytes that are not a code object for the expected AMDGPU arch."""


class OfflineMiss(MonoJitError):
    """A cache miss while MONO_JIT_OFFLINE=1 forbids compiling."""


class CaptureError(MonoJitError):
    """resolve() was called while a CUDA/HIP graph capture is in progress."""


class LockTimeout(MonoJitError):
    """Waiting for another process's compile of the same key took too long."""


class UntrustedRoot(MonoJitError):
    """A cache root is writable by others or owned by another user."""


class BundleError(MonoJitError):
    """An export bundle is malformed, tampered with or of an unknown schema."""


class RemoteError(MonoJitError):
    """The registry tier (push, pull, MONO_JIT_REMOTE) failed: bad artifact, refused request."""


class RemoteUnavailable(RemoteError):
    """The registry could not be reached or did not answer in time (not worth asking again)."""


class KernargError(MonoJitError, ValueError):
    """Arguments that do not fit a kernel's declared arguments or its code object's table."""
