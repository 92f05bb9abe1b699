"""Settings for the whole test session.

``pflower`` is imported first: it holds torch's CPU kernels to AVX2 (``numerics=avx2``, the
default) only where torch is not imported yet, and a test module that imports torch before
pflower would leave this process on the CPU's own kernels while the runs it starts hold AVX2.

Torch runs on one thread (``OMP_NUM_THREADS=1``, unless the caller set it), in this process and
the processes it starts: the README's ``pytest`` runs two test processes on two cores, and a
second OpenMP thread per process then waits for a core at every parallel region. A ResNet step
that takes 9 ms on one thread took 1 s on two while the other core was busy. (Runs set their
clients' threads themselves, ``train.threads``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: see above

import pflower  # noqa: F401  (before any test module imports torch: see the module docstring)

CACHE_ENV = "PFLOWER_CACHE"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Datasets and federations are cached in a folder of this session, not in the user's cache:
    the tests would fill it and push out the entries of real experiments. A ``PFLOWER_CACHE`` set
    by the caller wins. Set in ``os.environ`` so that Ray workers and deployment processes started
    by the tests inherit it."""
    if CACHE_ENV in os.environ:
        yield
        return
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("pflower-cache"))
    try:
        yield
    finally:
        os.environ.pop(CACHE_ENV, None)


SITE_ENV = "PFLOWER_DOCS_SITE"
"""A site this checkout's ``mkdocs build --strict`` already wrote (``.ci/run`` builds it once and
passes it to both test tiers, not three builds of about 40 s each on the 2-core VM)."""


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built once per test process with ``mkdocs build --strict`` (about
    40 s on the 2-core VM) for the tests that read it (as HTML, or in a browser), or the one
    ``PFLOWER_DOCS_SITE`` names."""
    if built := os.environ.get(SITE_ENV):
        site = Path(built)
        assert (site / "index.html").is_file(), f"{SITE_ENV}={built} holds no built site"
        return site
    site = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-5000:]
    return site
