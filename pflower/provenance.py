"""Which pflower code a process runs: results name their code, and a run never mixes two.

A sweep's driver process imports pflower once, but every job starts new worker processes (Ray
actors in a simulation, ClientApp processes in a deployment) that import pflower's files as they
are at that moment. Code edited while a sweep runs would give the later jobs a server running
the old code and clients running the new one: a silent mix, and with a changed partition scheme
even two different federations. A deployment whose SuperNodes run another pflower than its
SuperLink's ServerApp is the same mix.

`CODE_FINGERPRINT` hashes the contents of pflower's source files when this module is first
imported, which ``import pflower`` does: it names the code the process started with. The server
puts it into every message it sends (`CODE_KEY`); every client compares it with its own
(`check_same_code`) and refuses to work for a server running other code.
``summary.json`` records it with the git commit (`code_version`), and beside it one
fingerprint per part of the code that decides a run's numbers (`COMPONENTS`: data,
partition, split, model, training and evaluation, configuration, tuning; and the method's own
modules, `record_method_files`), so that a stored result can be checked against the code
installed now part by part ([`pflower.tuning.baselines`][pflower.tuning.baselines]). Those
fingerprints read the code, not its prose (`code_text`): a corrected docstring or comment keeps
the stored runs; `CODE_FINGERPRINT`, which guards a federation against a mix, reads every byte.

The same record names the process's numerics (`numerics`): ``import pflower`` holds
torch's CPU kernels to AVX2 (`hold_kernels`) before anything imports torch, so that one
configuration computes the same numbers, to the last digit, on any x86-64 CPU with AVX2.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import io
import json
import os
import platform
import subprocess
import sys
import threading
import tokenize
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pflower.registry import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parent

CODE_KEY = "pflower-code"
"""The message config key holding the server's `CODE_FINGERPRINT`."""

ALLOW_MISMATCH_ENV = "PFLOWER_ALLOW_CODE_MISMATCH"
"""Set to ``1`` on a client's machine to let it work for a server running other pflower code."""


def source_fingerprint(package_dir: Path = PACKAGE_DIR) -> str:
    """A short SHA-256 over the relative path and the bytes of every ``.py`` file of the package
    (file times and locations do not matter: two checkouts of one commit agree)."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


CODE_FINGERPRINT = source_fingerprint()

COMPONENTS: dict[str, tuple[str, ...]] = {
    "split": ("datasets/split.py",),
    "partition": ("datasets/partitioners/", "blocks/partitions.py"),
    "data": ("datasets/", "blocks/datasets.py"),
    "model": ("models/", "blocks/models.py"),
    "training and evaluation": (
        "core/",
        "server/",
        "client/",
        "robust/",
        "results/statistics.py",
        "results/rows.py",
        "results/summary.py",
        "results/rundir.py",
    ),
    "configuration": ("config/", "blocks/", "compose.py", "conf/"),
    "tuning": ("tuning/", "searchspace.py"),
}
"""The parts of the code that decide a run's numbers, by the paths (relative to the package;
``conf/`` is the Hydra config tree) of their files. A file belongs to the first part whose
prefix it has; pflower's other files (command line, reports, deployment, the runtime's
transport) do not change what a run computes, and the algorithms count per method
(`record_method_files`)."""

_METHOD_FILES: dict[str, tuple[Path, ...]] = {}


def code_text(source: str) -> str:
    """What of a Python source decides what it computes: the source without its comments, its
    bare string statements (docstrings, module, class and function, and the strings that
    document an attribute), its blank lines and the whitespace that ends a line, where the
    line ends outside a string literal (a literal's own lines stay as they are).

    Prose then changes no fingerprint: a corrected docstring leaves a part's stored runs
    accepted, where a fingerprint of the file's bytes asks for a rerun to show what was plain.
    Every token that Python executes stays, indentation included; the positions come from `ast`
    and `tokenize`, which read a file alike on Python 3.11 to 3.13 (checked on pflower's files
    and on f-strings holding ``#``)."""
    # the lines as ast and tokenize count them (str.splitlines also breaks at \f, \x1c, ...)
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    spans = [
        (token.start, token.end)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    nodes = list(ast.walk(ast.parse(source)))
    prose = [node for node in nodes if isinstance(node, ast.Expr) and _is_text(node.value)]
    for node in prose:
        # ast counts columns in UTF-8 bytes, tokenize (and str) in characters
        end_line = node.end_lineno or node.lineno
        start = (node.lineno, _column(lines[node.lineno - 1], node.col_offset))
        end = (end_line, _column(lines[end_line - 1], node.end_col_offset or 0))
        spans.append((start, end))
    blanked = {id(node.value) for node in prose}
    in_literal = {  # the lines that end inside a string literal that stays
        number
        for node in nodes
        if isinstance(node, ast.Constant | ast.JoinedStr) and id(node) not in blanked
        for number in range(node.lineno, node.end_lineno or node.lineno)
    }
    for (first, first_column), (last, last_column) in spans:
        for number in range(first, last + 1):
            line = lines[number - 1]
            begin = first_column if number == first else 0
            stop = last_column if number == last else len(line)
            lines[number - 1] = line[:begin] + " " * (stop - begin) + line[stop:]
    return "\n".join(
        line if number in in_literal else line.rstrip()
        for number, line in enumerate(lines, start=1)
        if number in in_literal or line.strip()
    )


def _is_text(node: ast.expr) -> bool:
    """Whether ``node`` is a plain string constant (a statement of one does nothing)."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _column(line: str, byte_offset: int) -> int:
    """The character column of ``line`` at UTF-8 byte ``byte_offset``."""
    return len(line.encode()[:byte_offset].decode())


def python_source(data: bytes) -> str:
    """A Python file's bytes decoded as Python decodes them (its coding line, a UTF-8 BOM)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


@functools.cache
def _digests_version() -> str:
    """A hash of the code that makes the digests: an edit to `code_text` starts a new cache."""
    maker = "".join(inspect.getsource(f) for f in (code_text, _is_text, _column, python_source))
    return hashlib.sha256(maker.encode()).hexdigest()[:12]


def _digest_cache_file() -> Path | None:
    """The digest cache (None where this user has no home folder, or pflower no sources)."""
    try:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return root / "pflower" / f"code-digests-{_digests_version()}.json"
    except (RuntimeError, OSError):  # no HOME and no password entry; no .py files
        return None


@functools.cache
def _known_digests() -> dict[str, str]:
    """The digest cache of this user (a cache that cannot be read is empty)."""
    file = _digest_cache_file()
    try:
        known = json.loads(file.read_text()) if file else {}
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def code_digests(paths: Iterable[Path]) -> list[str]:
    """The SHA-256 of what each file decides (`code_text` of a Python file; any other file's
    bytes).

    Reading a Python file's tokens takes about 5 ms of pure Python, a whole part's files a
    second: each digest is kept in a cache file (``$XDG_CACHE_HOME/pflower``, default
    ``~/.cache/pflower``) under the SHA-256 of the file's bytes, so a process reads and hashes
    the files and works out only those it has not seen. A cache that cannot be written is
    left as it is."""
    known = _known_digests()
    digests, added = [], False
    for path in paths:
        data = path.read_bytes()
        key = hashlib.sha256(data).hexdigest()
        if path.suffix != ".py":
            digests.append(key)
            continue
        if key not in known:
            code = code_text(python_source(data)).encode()
            known[key] = hashlib.sha256(code).hexdigest()
            added = True
        digests.append(known[key])
    file = _digest_cache_file()
    if added and file is not None:
        with contextlib.suppress(OSError):
            file.parent.mkdir(parents=True, exist_ok=True)
            temporary = file.with_name(f"{file.name}.{os.getpid()}.{threading.get_ident()}")
            temporary.write_text(json.dumps(dict(known)))
            temporary.replace(file)
    return digests


def files_fingerprint(files: Iterable[tuple[str, Path]]) -> str:
    """A short SHA-256 over ``(name, path)`` pairs: each name and the digest of what its file
    decides (`code_digests`)."""
    pairs = sorted(files)
    digest = hashlib.sha256()
    for (name, _), code in zip(pairs, code_digests(path for _, path in pairs), strict=True):
        digest.update(f"{name}\0{code}\0".encode())
    return digest.hexdigest()[:16]


def _conf_dir(package_dir: Path) -> Path:
    """The Hydra config tree beside the package (a checkout) or in its ``_app`` copy (a wheel)."""
    for candidate in (package_dir.parent / "conf", package_dir / "_app" / "conf"):
        if candidate.is_dir():
            return candidate
    return package_dir.parent / "conf"


@functools.cache
def component_fingerprints(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """One fingerprint per part of `COMPONENTS`, over its files as they are now."""
    files = [(p.relative_to(package_dir).as_posix(), p) for p in package_dir.rglob("*.py")]
    conf = _conf_dir(package_dir)
    files += [(f"conf/{p.relative_to(conf).as_posix()}", p) for p in conf.rglob("*.yaml")]
    members: dict[str, list[tuple[str, Path]]] = {part: [] for part in COMPONENTS}
    for name, path in files:
        part = next((k for k, v in COMPONENTS.items() if name.startswith(v)), None)
        if part is not None:
            members[part].append((name, path))
    return {part: files_fingerprint(found) for part, found in members.items()}


def record_method_files(method: str, files: Iterable[Path]) -> None:
    """Record the source files of algorithm ``method`` (its module and the modules of pflower's
    algorithms it builds on;
    [`pflower.core.algorithm.register_algorithm`][pflower.core.algorithm.register_algorithm] calls
    this)."""
    _METHOD_FILES[method] = tuple(sorted(set(files)))


def method_fingerprint(method: str) -> str | None:
    """The fingerprint of ``method``'s source files as they are now; None for a method this
    process has not registered."""
    files = _METHOD_FILES.get(method)
    if files is None:
        return None
    return files_fingerprint((path.name, path) for path in files)


class CodeMismatchError(ConfigError):
    """A client received a message from a server that runs other pflower code."""


def check_same_code(config: Mapping[str, Any]) -> None:
    """Raise [`CodeMismatchError`][pflower.provenance.CodeMismatchError] when the server that sent a
    message with ``config`` runs
    other pflower code than this process (a message without
    [`CODE_KEY`][pflower.provenance.CODE_KEY], e.g. from a test
    driving a client directly, is not checked)."""
    theirs = config.get(CODE_KEY)
    if theirs is None or theirs == CODE_FINGERPRINT:
        return
    if os.environ.get(ALLOW_MISMATCH_ENV) == "1":
        return
    raise CodeMismatchError(
        f"the server runs pflower code {theirs} but this client runs {CODE_FINGERPRINT}: "
        "pflower's source changed after the run (or its sweep) started, or this node has "
        "another pflower installed. Results would mix two versions of the code, so the client "
        "stops. Rerun the job after the edit (run long sweeps from their own checkout, e.g. a "
        f"git worktree), install the same pflower everywhere, or set {ALLOW_MISMATCH_ENV}=1 "
        "on this node to go on anyway."
    )


PARTS_READ = "code"
"""What a record's part fingerprints read (``parts_read``): the files' code (`code_text`).
Records made before it (pflower before 2026-12-07) have no ``parts_read``: theirs read the files'
bytes, and equal the fingerprints of no later code."""


@functools.cache
def code_version(method: str | None = None) -> dict[str, Any]:
    """The code a run of ``method`` was made with, for ``summary.json``: ``fingerprint`` (this
    process's `CODE_FINGERPRINT`), ``commit`` (the git commit of the checkout pflower was
    imported from, None outside a git checkout), ``dirty`` (whether pflower's files differ from
    that commit; None when unknown), ``components`` (`component_fingerprints`, with
    ``method``: `method_fingerprint` where the method is registered) and ``parts_read``
    (`PARTS_READ`)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", ".") if commit is not None else None
    components = dict(component_fingerprints())
    if method is not None and (own := method_fingerprint(method)) is not None:
        components["method"] = own
    return {
        "fingerprint": CODE_FINGERPRINT,
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "components": components,
        "parts_read": PARTS_READ,
    }


KERNEL_CAPS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
"""The variables that cap the instruction set of torch's CPU kernels (its own ATen kernels,
oneDNN's convolutions, MKL's matrix products), with the values that make a CPU with AVX-512
compute what one with AVX2 only computes ([`numerics`][pflower.provenance.numerics])."""


def kernel_caps() -> dict[str, str]:
    """The [`KERNEL_CAPS`][pflower.provenance.KERNEL_CAPS] variables set in this process's
    environment, with their values."""
    return {name: os.environ[name] for name in KERNEL_CAPS if name in os.environ}


NUMERICS_ENV = "PFLOWER_NUMERICS"
"""How this process and the processes it starts hold torch's CPU kernels: ``avx2`` (the
default: the `KERNEL_CAPS` variables are set) or ``native`` (torch picks the CPU's widest
instruction set). The config key ``numerics`` sets it for a run (`hold_kernels`)."""

HELD = "avx2"
"""The `NUMERICS_ENV` value (and config value) that holds the kernels to AVX2."""


def cpu_without_avx2() -> str | None:
    """Why this CPU cannot run AVX2 kernels (capping a CPU above what it has would crash torch
    with an illegal instruction, not slow it down), None if it can. Reads ``/proc/cpuinfo``
    (Linux): elsewhere it cannot tell, and says so."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"a {machine or 'non-x86'} CPU has no AVX2"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next(
                (line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), []
            )
    except OSError:
        return "cannot tell whether this CPU has AVX2 (no /proc/cpuinfo)"
    missing = [flag for flag in ("avx2", "fma") if flag not in flags]
    return f"this CPU lacks {' and '.join(missing)}" if missing else None


def hold_kernels(mode: str) -> None:
    """Hold torch's CPU kernels to AVX2 (``mode="avx2"``) or let them use what the CPU has
    (``native``), for this process and those it starts, by setting or clearing the
    `KERNEL_CAPS` variables and `NUMERICS_ENV`. ``native`` clears only caps that
    an earlier ``avx2`` set (a user's own variables stay). On a CPU without AVX2 ``avx2`` sets
    no caps, and `numerics` records the fallback. Once torch is imported its kernels are chosen:
    then the processes this one starts follow them (``NUMERICS_ENV`` says what this process
    has, unless set), so that every process of a run computes alike whatever imported torch
    first."""
    if "torch" in sys.modules:
        os.environ.setdefault(NUMERICS_ENV, HELD if kernel_caps() == KERNEL_CAPS else "native")
        return
    if os.environ.get(NUMERICS_ENV) == HELD:
        for name, value in KERNEL_CAPS.items():
            if os.environ.get(name) == value:
                del os.environ[name]
    os.environ[NUMERICS_ENV] = mode
    if mode == HELD and cpu_without_avx2() is None:
        os.environ.update(KERNEL_CAPS)


def numerics() -> dict[str, Any]:
    """What decides the floating-point results of this process's torch: ``mode`` (``avx2`` when
    the `KERNEL_CAPS` variables hold its kernels, else ``native``), its version, the
    instruction set of its own CPU kernels (``torch.backends.cpu.get_cpu_capability()``) and the
    `KERNEL_CAPS` variables that were set; ``not_held`` says why, where ``avx2`` was asked
    (`NUMERICS_ENV`) but the kernels are not held. One run repeats itself to the last digit
    on one machine, but AVX-512 kernels round differently from AVX2 ones, and a sensitive run
    amplifies those last bits over its rounds (FedDyn with α = 1 ended 0.44 points apart on
    validation); with the three variables set to [`KERNEL_CAPS`][pflower.provenance.KERNEL_CAPS]'s
    values, a CPU with
    AVX-512 gives what one without it gives, to the last digit. Empty where torch was not
    imported (a run that failed before it). The clients of a deployment run on their own
    machines, which the server's record does not describe."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    caps = kernel_caps()
    record: dict[str, Any] = {
        "mode": HELD if caps == KERNEL_CAPS else "native",
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "caps": caps,
    }
    if os.environ.get(NUMERICS_ENV) == HELD and record["mode"] != HELD:
        record["not_held"] = cpu_without_avx2() or "torch was imported before pflower"
    return record


def _git(*args: str) -> str | None:
    """The output of ``git <args>`` run in the package folder, None if git cannot answer."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
