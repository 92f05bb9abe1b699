"""Provenance: a run records the code that made it, and clients refuse a server running other
code (the mix a sweep gets when pflower's files are edited while it runs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pflower.core.strategy
from pflower import provenance
from pflower.core.strategy import RoundFailedError
from pflower.provenance import (
    ALLOW_MISMATCH_ENV,
    CODE_FINGERPRINT,
    CODE_KEY,
    COMPONENTS,
    KERNEL_CAPS,
    NUMERICS_ENV,
    CodeMismatchError,
    check_same_code,
    code_version,
    component_fingerprints,
    method_fingerprint,
    numerics,
    source_fingerprint,
)
from tests.inprocess import run_inprocess


def _package(root: Path) -> Path:
    package = root / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "module.py").write_text("VALUE = 1\n")
    (package / "notes.txt").write_text("not code")
    return package


def test_the_fingerprint_depends_on_the_code_only(tmp_path: Path) -> None:
    package = _package(tmp_path / "a")
    before = source_fingerprint(package)
    copy = shutil.copytree(package, tmp_path / "b" / "pkg")  # another place, newer file times
    os.utime(copy / "sub" / "module.py", (0, 0))
    assert source_fingerprint(copy) == before
    (package / "notes.txt").write_text("changed, but not a source file")
    assert source_fingerprint(package) == before
    (package / "sub" / "module.py").write_text("VALUE = 2\n")
    assert source_fingerprint(package) != before
    (package / "sub" / "module.py").write_text("VALUE = 1\n")
    (package / "sub" / "module.py").rename(package / "sub" / "renamed.py")
    assert source_fingerprint(package) != before


def test_the_process_fingerprints_pflower_as_it_was_imported() -> None:
    assert source_fingerprint(provenance.PACKAGE_DIR) == CODE_FINGERPRINT
    assert len(CODE_FINGERPRINT) == 16
    version = code_version()
    assert version["fingerprint"] == CODE_FINGERPRINT
    assert version["commit"] is None or len(version["commit"]) == 40
    assert version["dirty"] in (None, True, False)


def test_a_client_refuses_a_server_running_other_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_MISMATCH_ENV, raising=False)
    check_same_code({CODE_KEY: CODE_FINGERPRINT, "server-round": 1})
    check_same_code({"server-round": 1})  # a message not from a pflower server: not checked
    with pytest.raises(CodeMismatchError) as raised:
        check_same_code({CODE_KEY: "0123456789abcdef"})
    message = str(raised.value)
    assert "0123456789abcdef" in message and CODE_FINGERPRINT in message
    assert ALLOW_MISMATCH_ENV in message
    monkeypatch.setenv(ALLOW_MISMATCH_ENV, "1")
    check_same_code({CODE_KEY: "0123456789abcdef"})


def test_a_run_whose_server_runs_other_code_stops_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's fingerprint stands for a driver that imported pflower before an edit; the
    clients (here in the same process) run the code as it is now. Every client refuses, so no
    round runs and the run is recorded as failed with the reason."""
    monkeypatch.delenv(ALLOW_MISMATCH_ENV, raising=False)
    monkeypatch.setattr(pflower.core.strategy, "CODE_FINGERPRINT", "0123456789abcdef")
    overrides = ["dataset=digits", "num_clients=2", "rounds=1", "min_clients=2"]
    with pytest.raises(RoundFailedError):
        run_inprocess(overrides, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"
    refusals = [f["error"] for f in summary["failures"]]
    assert len(refusals) == 2
    assert all("runs pflower code 0123456789abcdef" in error for error in refusals)


def test_a_part_fingerprint_changes_with_its_own_files_only(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    files = {
        "datasets/split.py": "split",
        "datasets/partitioners/iid.py": "partition",
        "datasets/loaders.py": "data",
        "core/training.py": "training and evaluation",
        "tuning/search.py": "tuning",
        "cli.py": None,  # decides no number
        "../conf/experiment/x.yaml": "configuration",
    }
    for name in files:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text("a = 1\n")
    fingerprints = component_fingerprints.__wrapped__  # uncached: the files change below
    before = fingerprints(package)
    assert set(before) == set(COMPONENTS)
    for name, part in files.items():
        (package / name).write_text("a = 2\n")
        after = fingerprints(package)
        assert {k for k in after if after[k] != before[k]} == ({part} if part else set()), name
        before = after


MODULE = '''"""A module."""

import math

MARKS = "\u2028\f"  # str.splitlines ends a line at each (the file holds the characters)
SCALE = 2.0
"""How far it scales."""
TEMPLATE = """first line

third line, after a blank one"""


class Step:
    """One step."""

    def size(self, x: float) -> float:
        """The step's size: ``x`` scaled, or "# none" past 3."""
        label = "# kept"  # a comment
        return math.sqrt(x) * SCALE if x < 3 else len(label)
'''

PROSE_EDITS = [
    ('"""A module."""', '"""A module, now explained at length.\n\nOver two paragraphs."""'),
    ('"""How far it scales."""', '"""How far it scales (ünits: none)."""'),
    ('"""One step."""\n', ""),
    ("# a comment", "# another comment, longer"),
    ("import math\n", "import math   \n\n\n"),
    ("        label", "\n        # why the label\n        label"),
    ('"""One step."""', '"""One step.  \n\n    In two paragraphs.   \n    """'),
]
CODE_EDITS = [  # whitespace inside a line counts: the text is kept as written
    ("SCALE = 2.0", "SCALE = 2.5"),
    ('"# kept"', '"# kept!"'),
    ("x < 3", "x <= 3"),
    ("return math.sqrt(x)", "return  math.sqrt(x)"),
    ("    def size", "    @staticmethod\n    def size"),
    ("first line\n\nthird", "first line\nthird"),
    ("first line\n", "first line  \n"),
]


@pytest.mark.parametrize(("old", "new"), PROSE_EDITS + CODE_EDITS)
def test_a_part_fingerprint_reads_code_not_prose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str
) -> None:
    """Comments, docstrings, blank lines and trailing spaces change no part's fingerprint (a
    corrected docstring keeps a part's stored runs); every executed token does, a ``#`` inside
    a string included."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    provenance._known_digests.cache_clear()
    module = tmp_path / "pkg" / "core" / "step.py"
    module.parent.mkdir(parents=True)
    module.write_text(MODULE)
    fingerprints = component_fingerprints.__wrapped__  # uncached: the file changes below
    before = fingerprints(tmp_path / "pkg")
    assert old in MODULE
    module.write_text(MODULE.replace(old, new, 1))
    compile(module.read_text(), str(module), "exec")  # still Python
    after = fingerprints(tmp_path / "pkg")
    changed = after["training and evaluation"] != before["training and evaluation"]
    assert changed == ((old, new) in CODE_EDITS)
    assert {k for k in after if after[k] != before[k]} <= {"training and evaluation"}


def test_a_python_file_is_read_as_python_reads_it(tmp_path: Path) -> None:
    """The coding line decides the text (and is itself a comment); a UTF-8 BOM changes nothing."""
    plain, latin, bom = (tmp_path / name for name in ("plain.py", "latin.py", "bom.py"))
    plain.write_bytes('X = "é"\n'.encode())
    latin.write_bytes(b"# coding: latin-1\n" + 'X = "é"\n'.encode())  # X = 'Ã©' there
    bom.write_bytes(b"\xef\xbb\xbf" + 'X = "é"\n'.encode())
    digests = provenance.code_digests([plain, latin, bom])
    assert digests[0] != digests[1]
    assert digests[0] == digests[2]


def test_the_digest_cache_gives_what_the_files_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A digest read from the cache is the one worked out from the file; an unwritable cache
    changes nothing but the time."""
    files = sorted((Path(provenance.__file__).parent / "core").glob("*.py"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    provenance._known_digests.cache_clear()
    worked_out = provenance.code_digests(files)
    assert [p.name for p in (tmp_path / "cache" / "pflower").iterdir()] == [
        f"code-digests-{provenance._digests_version()}.json"
    ]
    provenance._known_digests.cache_clear()
    assert provenance.code_digests(files) == worked_out  # now read from the cache file
    (tmp_path / "readonly").write_text("a file where a folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "readonly"))
    provenance._known_digests.cache_clear()
    assert provenance.code_digests(files) == worked_out
    provenance._known_digests.cache_clear()


def test_a_completed_run_records_its_code(tmp_path: Path) -> None:
    run_inprocess(["dataset=digits", "num_clients=2", "rounds=1"], tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    method = summary["config"]["strategy"]["name"]
    assert summary["code"] == code_version(method)
    parts = summary["code"]["components"]
    assert set(parts) == {*COMPONENTS, "method"}
    assert parts["method"] == method_fingerprint(method) != method_fingerprint("fedavg")
    assert summary["numerics"] == numerics()
    assert summary["numerics"]["torch"] == torch.__version__
    assert summary["config"]["numerics"] == "avx2"


def _numerics_of_a_process(prelude: str, **env: str) -> dict[str, object]:
    """:func:`numerics` of a new Python process that runs ``prelude``, imports pflower and
    torch, with ``env`` over an environment free of the kernel caps."""
    script = (
        f"{prelude}; import json, pflower, torch; from pflower.provenance import numerics; "
        "print(json.dumps(numerics()))"
    )
    base = {k: v for k, v in os.environ.items() if k not in KERNEL_CAPS and k != NUMERICS_ENV}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return dict(json.loads(done.stdout))


@pytest.mark.slow
def test_a_process_that_imported_torch_first_starts_processes_with_its_own_kernels() -> None:
    """Imported after torch, pflower cannot hold this process's kernels any more; the processes
    it starts (a run's workers) then use what this process uses, so one run computes alike in
    all its processes."""
    child = (
        "import json, subprocess, sys; "
        "script = 'import json, pflower, torch; from pflower.provenance import numerics; "
        "print(json.dumps(numerics()))'; "
        "print(subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, "
        "check=True).stdout.strip())"
    )
    script = (
        "import torch, json, pflower; from pflower.provenance import numerics; "
        f"print(json.dumps(numerics())); {child}"
    )
    base = {k: v for k, v in os.environ.items() if k not in KERNEL_CAPS and k != NUMERICS_ENV}
    done = subprocess.run(
        [sys.executable, "-c", script], env=base, capture_output=True, text=True, check=True
    )
    parent, started = (json.loads(line) for line in done.stdout.splitlines())
    assert parent["mode"] == "native" and parent["caps"] == {}
    assert started["mode"] == parent["mode"]
    assert started["cpu_capability"] == parent["cpu_capability"]


@pytest.mark.slow
def test_pflower_holds_the_cpu_kernels_to_avx2_unless_told_native() -> None:
    """``import pflower`` sets the caps (``ATEN_CPU_CAPABILITY=avx2`` and the others of
    ``KERNEL_CAPS``) before torch is imported, so a machine with AVX-512 computes what one
    without it computes, in every process a run starts, and the record says so;
    ``PFLOWER_NUMERICS=native`` (set by ``numerics=native``) leaves the CPU's own kernels."""
    if torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "NO AVX"):
        pytest.skip("this CPU has no AVX2 kernels to cap")
    assert _numerics_of_a_process("pass") == {
        "mode": "avx2",
        "torch": torch.__version__,
        "cpu_capability": "AVX2",
        "caps": KERNEL_CAPS,
    }
    native = _numerics_of_a_process("pass", PFLOWER_NUMERICS="native")
    assert native["mode"] == "native" and native["caps"] == {}
    # the command line's numerics=native, read before torch is imported, clears what the
    # import (or a parent process) set
    opted_out = _numerics_of_a_process(
        "import pflower.quickcheck as q; q.hold_numerics_of(['seed=1', 'numerics=native'])"
    )
    assert opted_out == native


def test_a_cpu_without_avx2_is_not_capped_above_what_it_has() -> None:
    """Capping a CPU without AVX2 at AVX2 would crash torch (illegal instruction): such a CPU
    runs its own kernels, and the record says why the run is not held."""
    record = _numerics_of_a_process("import platform; platform.machine = lambda: 'aarch64'")
    assert record["mode"] == "native"
    assert record["caps"] == {}
    assert record["not_held"] == "a aarch64 CPU has no AVX2"
