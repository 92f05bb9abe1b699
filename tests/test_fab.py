"""The Flower app bundle (FAB) that ``flwr run`` packs: the package and its config tree only, the
same from a checkout and from a wheel install, and a refused run says why."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk
from flwr.common.constant import FAB_MAX_SIZE

from pflower.config import RunRecord, base
from pflower.config.base import app_dir, app_files, conf_dir, stage_app
from pflower.deploy.control import SuperLinkControl
from pflower.deploy.topology import Endpoints, Security
from pflower.runtime.forkapp import app_digest, loaded_app_digest


def _unpacked(fab: bytes, folder: Path) -> set[str]:
    """Unpack ``fab`` into ``folder``; its top-level names."""
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        archive.extractall(folder)
        return {name.split("/")[0] for name in archive.namelist()}


def test_the_checkouts_fab_holds_the_package_and_its_config_tree_only(tmp_path: Path) -> None:
    """Results, docs and tests stay out (the results alone outgrew Flower's 10 MiB limit), and
    the FAB's code is the imported pflower's, so a fork server keeps its import for it."""
    fab = build_fab_from_disk(app_dir())
    assert _unpacked(fab, tmp_path) == {".info", "conf", "pflower", "pyproject.toml"}
    assert len(fab) < FAB_MAX_SIZE / 4
    assert app_digest(tmp_path / "pflower", tmp_path / "conf") == loaded_app_digest()


def test_a_wheel_install_stages_the_checkouts_fab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel keeps ``pyproject.toml`` and ``conf/`` in ``pflower/_app``, apart from the code;
    staged, it packs into the checkout's FAB byte for byte."""
    checkout = build_fab_from_disk(stage_app(tmp_path / "from-checkout"))
    wheel = tmp_path / "site-packages" / "pflower"
    for relative, path in app_files(base._PACKAGE_DIR, conf_dir()):
        folder, _, rest = relative.partition("/")
        target = wheel / rest if folder == "pflower" else wheel / "_app" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    shutil.copy2(app_dir() / "pyproject.toml", wheel / "_app" / "pyproject.toml")
    monkeypatch.setattr(base, "_PACKAGE_DIR", wheel)
    assert app_dir() == wheel / "_app"
    staged = stage_app(tmp_path / "from-wheel")
    assert not (staged / "pflower" / "_app").exists()
    assert build_fab_from_disk(staged) == checkout


def test_a_run_that_flower_refuses_names_flowers_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``submit`` hands ``flwr run`` the staged app and, when no run starts, raises with Flower's
    message instead of a bare ``KeyError``."""
    seen: list[set[str]] = []

    def refuse(self: SuperLinkControl, *args: str, **_: object) -> subprocess.CompletedProcess[str]:
        seen.append({path.name for path in Path(args[1]).iterdir()})
        reply = {"success": False, "error-message": "FAB size exceeds maximum allowed size"}
        return subprocess.CompletedProcess(["flwr", *args], 1, json.dumps(reply), "")

    monkeypatch.setattr(SuperLinkControl, "flwr", refuse)
    control = SuperLinkControl(tmp_path / "home", tmp_path / "logs", Endpoints(), Security(), 2)
    with pytest.raises(RuntimeError, match="started no run: FAB size exceeds"):
        control.submit(RunRecord(("strategy=fedavg",), tmp_path / "run"))
    assert seen == [{"conf", "pflower", "pyproject.toml"}]
