"""The toolchain FlyDSL compiles with, its fingerprint for the cache key, and a clean environment.

FlyDSL's embedded LLVM emits gfx950 code; the only external pieces are ``$ROCM_PATH/llvm/bin/
ld.lld`` (must link code object v6: LLVM >= 19) and ``$ROCM_PATH/amdgcn/bitcode`` (where FlyDSL's
backend looks for them).
With no ROCm installed we stage a private ROCm-layout root of symlinks inside the writable
cache and point ``ROCM_PATH`` at it. Nothing here imports FlyDSL or torch: the fingerprint comes
from FlyDSL's installed RECORD (the sha256 of every file pip installed), so a serving process can
compute cache keys cheaply.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from mono_jit.cache.digest import sha256
from mono_jit.cache.fs import make_dirs, read_regular, remove, write_new
from mono_jit.cache.store import unique_suffix
from mono_jit.record import Record

from ..config import Settings
from ..errors import ToolchainError

MEMO_CAP = 1 << 20  # probes.json holds a few dozen short lines
MIN_LLD_MAJOR = 19  # first LLVM whose lld accepts code object v6 (abi=600)
FLYDSL_DIST = "flydsl"
# FlyDSL reads these bare or prefixed variables; any of them can change or break the bytes.
_UNSAFE_ENV = ("ARCH", "COMPILE_ONLY", "HSA_OVERRIDE_GFX_VERSION")
_UNSAFE_ENV_PREFIXES = ("FLYDSL_",)


class Linker(Record):
    path: Path
    version: str  # e.g. "22.1.8"


class Toolchain(Record):
    """Resolved compile toolchain: its pieces, its fingerprint (the key factors: content digests
    and versions, never paths), and where its ROCm root is or will be staged."""

    linker: Linker
    bitcode_dir: Path
    fingerprint: dict[str, str]
    system_root: Path | None  # $ROCM_PATH or /opt/rocm when it holds both pieces
    stage_base: Path  # where a private root is staged when there is no system root

    @property
    def rocm_path(self) -> Path:
        """The ROCm root a compile runs with: the system's, else a private one staged (or
        repaired) now. Only a compile asks, so a run of cache hits never touches the staged root."""
        if self.system_root is not None:
            return self.system_root
        return stage_root(self.stage_base, self.linker, self.bitcode_dir)


class ProbeMemo:
    """Results of slow probes (running ld.lld, hashing the bitcode) keyed by the stat signature
    (path, size, mtime, inode) of the files probed, kept in one JSON file, the way ccache knows a
    compiler by its mtime and size. The values are content facts; a changed signature only means
    "probe again". A lost or unreadable memo costs a probe, never a wrong answer. A memo that
    may not `save` (an offline process writes nothing) is only read."""

    def __init__(self, path: Path | None, save: bool = True) -> None:
        self._path = path
        self._may_save = save
        self._data: dict[str, str] = self._read()

    def _read(self) -> dict[str, str]:
        if self._path is None:
            return {}
        try:
            loaded = json.loads(read_regular(self._path, MEMO_CAP))
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    @staticmethod
    def signature(kind: str, files: Sequence[str | Path]) -> str:
        """The probe kind and each file's real folder, name, size, mtime and inode (stat follows
        symlinks, so these are the target's). Folders are resolved once each: a probe of the
        51 bitcode files costs one realpath and 51 stats, not 51 realpaths."""
        parts = [kind]
        real: dict[str, str] = {}
        for file in files:
            name = os.fspath(file)
            st = os.lstat(name)
            if stat.S_ISLNK(st.st_mode):  # a symlinked file: its target names the content
                where = os.path.realpath(name)
                st = os.stat(where)
            else:
                folder, base = os.path.split(name)
                if folder not in real:
                    real[folder] = os.path.realpath(folder or ".")
                where = os.path.join(real[folder], base)
            parts.append(f"{where}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
        return sha256("\n".join(parts).encode()).hexdigest()

    def get(self, kind: str, files: Sequence[str | Path], probe: Callable[[], str]) -> str:
        """The memoised answer of `probe` while none of `files` changed (stat signature), else
        a fresh probe, remembered."""
        sig = self.signature(kind, files)
        if sig not in self._data:
            self._data[sig] = probe()
            self._save()
        return self._data[sig]

    def _save(self) -> None:
        if self._path is None or not self._may_save:
            return
        tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.{unique_suffix(6)}")
        # Merged with what is on disk now: compile workers probing at once would otherwise each
        # replace the file with only their own answers, and a later process would probe again.
        self._data = {**self._read(), **self._data}
        try:
            make_dirs(self._path.parent)  # every missing level 0700, whatever the umask
            write_new(tmp, json.dumps(self._data, sort_keys=True).encode())
            os.replace(tmp, self._path)
        except OSError:
            pass  # the memo is an optimisation only (gc removes a temp file left behind)


def lld_version(path: Path) -> str:
    """The version ld.lld reports, e.g. '22.1.8'; raises if it is not a usable lld."""
    import subprocess  # only when the probe memo has no answer

    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        raise ToolchainError(f"cannot run {path}: {exc}") from None
    match = re.search(r"LLD (\d+)\.(\d+)(?:\.(\d+))?", out.stdout + out.stderr)
    if out.returncode != 0 or not match:
        raise ToolchainError(f"{path} is not an LLVM lld (it printed {out.stdout.strip()[:120]!r})")
    return ".".join(g for g in match.groups() if g is not None)


def _expand(pattern: str) -> list[str]:
    """The existing paths `pattern` names, sorted, where a component may end in ``*`` (any
    non-hidden name with that prefix): what glob.glob finds for such patterns, one listdir per
    wildcard level, without importing glob and fnmatch on the cache-hit path."""
    found = ["/"]
    for part in pattern.strip("/").split("/"):
        if not part.endswith("*"):
            found = [os.path.join(folder, part) for folder in found if os.path.lexists(os.path.join(folder, part))]
            continue
        prefix, matched = part[:-1], []
        for folder in found:
            try:
                names = os.listdir(folder)
            except OSError:  # not a folder, or unreadable: glob finds nothing below it either
                continue
            matched += [os.path.join(folder, n) for n in names if n.startswith(prefix) and not n.startswith(".")]
        found = matched
    return sorted(found)


def _which(name: str) -> Path | None:
    """shutil.which(name) for a POSIX PATH, without importing shutil on the cache-hit path."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or os.curdir, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _lld_candidates(settings: Settings) -> Iterator[Path]:
    """ld.lld candidates in order, generated lazily: the /usr/lib/llvm-* glob only runs when
    nothing before it was accepted."""
    if settings.ld_lld is not None:
        yield settings.ld_lld  # explicit: no fallback
        return
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if root:
            yield Path(root) / "llvm" / "bin" / "ld.lld"
    on_path = _which("ld.lld")
    if on_path:
        yield on_path
    by_major: dict[str, int] = {}  # /usr/lib/llvm-22/bin/ld.lld -> 22; llvm-<not a number> is no version
    for path in _expand("/usr/lib/llvm-*/bin/ld.lld"):
        major = path.split("/")[3].removeprefix("llvm-")
        if major.isdigit():
            by_major[path] = int(major)
    yield from (Path(p) for p in sorted(by_major, key=by_major.__getitem__, reverse=True))


def find_linker(settings: Settings, memo: ProbeMemo | None = None) -> Linker:
    """The first ld.lld that links code object v6 (ROCm's, then PATH, then /usr/lib/llvm-*)."""
    memo = memo or ProbeMemo(None)
    rejected = []
    for path in _lld_candidates(settings):
        if not path.is_file():
            if path == settings.ld_lld:  # the one the user named: say where it was looked for
                rejected.append(f"MONO_JIT_LD_LLD={path} {'is not a file' if path.exists() else 'does not exist'}")
            continue
        try:
            version = memo.get("ld.lld --version", [path], lambda: lld_version(path))
        except ToolchainError as exc:
            rejected.append(str(exc))
            continue
        if int(version.split(".")[0]) >= MIN_LLD_MAJOR:
            return Linker(path, version)
        rejected.append(f"{path} is LLD {version} (< {MIN_LLD_MAJOR}: it refuses code object v6)")
    detail = "; ".join(rejected) or "none found"
    raise ToolchainError(
        f"no ld.lld >= {MIN_LLD_MAJOR} for code object v6 ({detail}); on Debian 12: "
        "apt-get install lld-22, or set MONO_JIT_LD_LLD"
    )


def find_bitcode(settings: Settings) -> Path:
    """A folder of AMDGPU device bitcode (ocml.bc, ockl.bc, ...): the explicit one, else the
    first of $ROCM_PATH, /opt/rocm, /usr/lib/*, /usr/lib/llvm-*/lib/clang/* (each glob only run
    when nothing before it holds ocml.bc)."""
    candidates: list[Path] = []
    if settings.device_libs is not None:
        explicit = settings.device_libs
        groups: tuple[Callable[[], list[Path]], ...] = (lambda: [explicit],)
    else:
        groups = (
            lambda: [Path(r) / "amdgcn" / "bitcode" for r in (os.environ.get("ROCM_PATH"), "/opt/rocm") if r],
            lambda: [Path(p) for p in _expand("/usr/lib/*/amdgcn/bitcode")],
            lambda: [Path(p) for p in _expand("/usr/lib/llvm-*/lib/clang/*/lib/amdgcn/bitcode")],
        )
    for group in groups:
        for folder in group():
            candidates.append(folder)
            if (folder / "ocml.bc").is_file():
                return folder
    raise ToolchainError(
        "no AMDGPU device bitcode (ocml.bc) found in "
        f"{', '.join(map(str, candidates)) or 'any known place'}; on Debian 12: "
        "apt-get install rocm-device-libs, or set MONO_JIT_DEVICE_LIBS"
    )


def bitcode_files(folder: Path) -> list[str]:
    """The paths of a bitcode folder's .bc files, sorted (what `folder.glob("*.bc")` finds: no
    hidden names; one scandir, and strings: every process start stats these 51 files, and
    making a Path of each would cost more than the stats)."""
    with os.scandir(folder) as found:
        paths = [e.path for e in found if e.name.endswith(".bc") and not e.name.startswith(".") and e.is_file()]
    return sorted(paths)


def bitcode_digest(folder: Path) -> str:
    """sha256 over (name, bytes) of every .bc file, as FlyDSL's toolkit fingerprint does."""
    digest = sha256()
    for path in bitcode_files(folder):
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as file:
            digest.update(sha256(file.read()).digest())
    return digest.hexdigest()


def flydsl_dist_info() -> Path:
    """FlyDSL's installed .dist-info folder, found beside the package without importing it
    (importlib.metadata's scan of every distribution costs more than the whole cache load)."""
    spec = importlib.util.find_spec(FLYDSL_DIST)
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError("FlyDSL is not installed (mono-jit's build extra brings FlyDSL 0.5.0)")
    site = Path(next(iter(spec.submodule_search_locations))).parent
    found = [site / name for name in sorted(os.listdir(site))
             if name.startswith(f"{FLYDSL_DIST}-") and name.endswith(".dist-info")]
    if len(found) != 1:
        raise ToolchainError(f"expected one {FLYDSL_DIST}-*.dist-info in {site}, found {len(found)}: reinstall FlyDSL")
    return found[0]


def flydsl_version(dist_info: Path) -> str:
    """The version in the .dist-info folder's name (normalised by the wheel spec)."""
    return dist_info.name[len(FLYDSL_DIST) + 1: -len(".dist-info")]


def flydsl_files_digest(dist_info: Path) -> str:
    """sha256 over the RECORD lines (path, sha256, size) of FlyDSL's installed package files.

    pip checked each file against these hashes at install, so this covers every .py and native
    library without reading hundreds of MB at every start. `mono-jit doctor --deep` re-hashes the
    files to catch edits made after install.
    """
    try:
        record = (dist_info / "RECORD").read_text()
    except OSError:
        raise ToolchainError(f"FlyDSL's RECORD is missing in {dist_info}: reinstall it with pip") from None
    lines = sorted(
        line for line in record.splitlines()
        if line.startswith("flydsl") and "__pycache__" not in line and not line.split(",")[0].endswith(".pyc")
    )
    return sha256("\n".join(lines).encode()).hexdigest()


def flydsl_files_modified() -> list[str]:
    """Installed FlyDSL files whose bytes no longer match RECORD (slow: hashes everything)."""
    import base64
    import hashlib
    import importlib.metadata  # doctor only: its scan of every distribution is fine here

    dist = importlib.metadata.distribution(FLYDSL_DIST)
    bad = []
    for entry in dist.files or []:
        if entry.hash is None or "__pycache__" in str(entry):
            continue
        data = Path(str(entry.locate())).read_bytes()
        actual = base64.urlsafe_b64encode(hashlib.new(entry.hash.mode, data).digest()).rstrip(b"=").decode()
        if actual != entry.hash.value:
            bad.append(str(entry))
    return bad


def _is_rocm_root(root: Path, linker: Linker, bitcode: Path) -> bool:
    try:
        return (root / "llvm/bin/ld.lld").resolve() == linker.path.resolve() and (
            (root / "amdgcn/bitcode").resolve() == bitcode.resolve()
        )
    except OSError:
        return False


STAGE_ATTEMPTS = 8


def stage_root(base: Path, linker: Linker, bitcode: Path) -> Path:
    """A private ROCm-layout root of symlinks: <base>/<digest>/{llvm/bin/ld.lld, amdgcn/bitcode}.

    Built in a temp folder and published by one rename, so concurrent stagers never see a
    half-built root. A root that exists but differs (a cache copied with its symlinks
    dereferenced, a moved toolchain, a planted file) is replaced, never trusted or kept.
    """
    name = sha256(f"{linker.path.resolve()}\0{bitcode.resolve()}".encode()).hexdigest()[:16]
    root = base / name
    for _ in range(STAGE_ATTEMPTS):  # a racing repairer may have the root set aside for a moment
        if _is_rocm_root(root, linker, bitcode):
            return root
        try:
            tmp = _build_root(base, linker, bitcode)
        except OSError as exc:
            raise ToolchainError(f"cannot stage a toolchain root in {base}: {exc.strerror or exc} "
                                 "(make it a writable folder, or set ROCM_PATH to a ROCm install)") from None
        try:
            _publish_root(tmp, root, linker, bitcode)
        finally:
            remove(tmp)
    if not _is_rocm_root(root, linker, bitcode):
        raise ToolchainError(f"could not stage a toolchain root at {root}: remove it and retry")
    return root


def _build_root(base: Path, linker: Linker, bitcode: Path) -> Path:
    """A new root in <base>/.tmp-<random>, every folder 0700 whatever the umask."""
    tmp = base / f".tmp-{unique_suffix(32)}"
    make_dirs(tmp / "llvm" / "bin")
    make_dirs(tmp / "amdgcn")
    (tmp / "llvm" / "bin" / "ld.lld").symlink_to(linker.path.resolve())
    (tmp / "amdgcn" / "bitcode").symlink_to(bitcode.resolve())
    return tmp


def _publish_root(tmp: Path, root: Path, linker: Linker, bitcode: Path) -> None:
    """Rename `tmp` to `root`. A `root` in the way that is not a good root is first renamed
    aside (under a .tmp- name, so gc finds it if we die) and removed. A racing stager may win
    either rename; the caller checks what ended up at `root`."""
    try:
        os.rename(tmp, root)
        return
    except OSError:
        if _is_rocm_root(root, linker, bitcode):
            return  # another process staged it first
    aside = root.with_name(f".tmp-{unique_suffix(32)}")
    try:
        os.rename(root, aside)
    except FileNotFoundError:
        pass  # a racing repairer moved it already
    try:
        os.rename(tmp, root)
    except OSError:
        pass  # a racing repairer published its copy first
    remove(aside)




_resolved: dict[tuple, Toolchain] = {}


def resolve_toolchain(settings: Settings) -> Toolchain:
    """Find ld.lld and the bitcode, fingerprint them with FlyDSL, and pick the ROCm root:
    $ROCM_PATH (or /opt/rocm) when it holds both, else a staged one (at the first compile:
    Toolchain.rocm_path). Resolved once per process
    for the settings and ROCM_PATH that decide it: a runner resolves a whole grid with it."""
    decided_by = (settings.ld_lld, settings.device_libs, settings.writable_root, os.environ.get("ROCM_PATH"))
    if decided_by not in _resolved:
        _resolved[decided_by] = _resolve_toolchain(settings)
    return _resolved[decided_by]


def _resolve_toolchain(settings: Settings) -> Toolchain:
    toolchain_dir = settings.writable_root / "v1" / "toolchain"
    memo = ProbeMemo(toolchain_dir / "probes.json", save=not settings.offline)
    linker = find_linker(settings, memo)
    bitcode = find_bitcode(settings)
    dist_info = flydsl_dist_info()
    record = dist_info / "RECORD"
    fingerprint = {
        "flydsl": flydsl_version(dist_info),
        # Each digest is recomputed only when a file's stat signature changed (ccache's direct
        # mode): a process start costs a few stats, not reading and hashing the files.
        "flydsl_files": (memo.get("flydsl RECORD", [record], lambda: flydsl_files_digest(dist_info))
                         if record.is_file() else flydsl_files_digest(dist_info)),  # (raises: no RECORD)
        "ld_lld": linker.version,
        "device_bitcode": memo.get("bitcode", bitcode_files(bitcode), lambda: bitcode_digest(bitcode)),
    }
    system = next((Path(c) for c in (os.environ.get("ROCM_PATH"), "/opt/rocm")
                   if c and _is_rocm_root(Path(c), linker, bitcode)), None)
    return Toolchain(linker, bitcode, fingerprint, system, toolchain_dir)


def describe(fingerprint: dict) -> str:
    """A toolchain fingerprint for a log line: each factor, digests cut to 12 hex digits."""
    shown = {name: str(value) for name, value in sorted(fingerprint.items())}
    return ", ".join(f"{name}={text[:12] if len(text) == 64 else text}" for name, text in shown.items())


def removed_variables(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `base` (default: os.environ) that compile workers run without: FlyDSL's
    (FLYDSL_*) and those FlyDSL reads bare (ARCH, COMPILE_ONLY, HSA_OVERRIDE_GFX_VERSION); any
    of them can change or break the bytes. `mono-jit config` lists them."""
    source = os.environ if base is None else base
    return {k: v for k, v in sorted(source.items()) if k in _UNSAFE_ENV or k.startswith(_UNSAFE_ENV_PREFIXES)}


def compile_environment(toolchain: Toolchain, arch: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a compile worker runs with: explicit arch, our ROCm root, no FlyDSL knobs.

    FlyDSL reads a bare ARCH before FLYDSL_GPU_ARCH and silently targets gfx942 when it detects
    nothing; a bare COMPILE_ONLY makes compile return None; FLYDSL_DEBUG_* embeds paths. Its
    own disk cache is off: our cache is the only one, and its 0600 pickles would not be shared.
    """
    source = os.environ if base is None else base
    removed = removed_variables(source)
    env = {k: v for k, v in source.items() if k not in removed}
    env.update(
        FLYDSL_GPU_ARCH=arch,
        ROCM_PATH=str(toolchain.rocm_path),
        FLYDSL_RUNTIME_ENABLE_CACHE="0",
        FLYDSL_DEBUG_ENABLE_DEBUG_INFO="0",
    )
    return env
