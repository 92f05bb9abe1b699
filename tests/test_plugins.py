"""The public API and plugins (docs: guide, plugins), and the tutorial that ranks a plugin method.

- ``pflower.api`` keeps its names, and pflower's own algorithms register through it;
- plugins come from ``PFLOWER_PLUGINS`` and from the entry point group ``pflower.plugins`` (a
  dist-info folder on the Python path, so ``importlib.metadata`` finds it without pip), and load in
  new processes; one that fails stops the command with one line naming it (exit code 2);
- the configuration check before imports knows a plugin's options (its cache is keyed by the
  plugins' code);
- a plugin dataset, partition scheme and model run (slow);
- the tutorial ``docs/tutorials/rank-your-method.md`` runs as written: its files are written into a
  fresh folder and its commands run there (simulation, local deployment, tuning, leaderboard), and
  its last command, against the previous protocol's stored cpu runs, is refused from the
  repository's root (slow).

Plugins are imported in subprocesses only: registering in this process would add an algorithm
without a documentation page to the registry the other tests read.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pflower.api as api
from pflower.core.algorithm import ALGORITHMS
from pflower.plugins import ENTRY_POINT_GROUP, PLUGINS_ENV, Plugin, configured_plugins, fingerprint
from tests.deploy_helpers import free_port, free_port_block

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorials" / "rank-your-method.md"
FILE = re.compile(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", re.S)
BLOCK = re.compile(r"<!-- tutorial(?:: ([^>]*))? -->\n```bash\n(.*?)```", re.S)

PUBLIC = {
    "AlgorithmOptions",
    "Collapse",
    "ConfigError",
    "DatasetBlock",
    "ImageDataset",
    "ImageSplit",
    "IndexPartitioner",
    "ModelBlock",
    "PartitionBlock",
    "PersonalClient",
    "PersonalizedStrategy",
    "Regularizer",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "register_partitioner",
    "require",
    "tunable",
}
"""The names a plugin may rely on: removing one breaks plugins, so it fails here first."""


def _tutorial_files(folder: Path) -> None:
    """Write the files the tutorial shows (``<!-- file: PATH -->`` blocks) into ``folder``."""
    for path, text in FILE.findall(TUTORIAL.read_text()):
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)


def _env(tmp_path: Path, *paths: Path, plugins: str | None = None) -> dict[str, str]:
    """This environment with pflower's checkout and ``paths`` on the Python path, ``plugins`` as
    ``PFLOWER_PLUGINS`` (unset: none), and a schema cache of the test's own."""
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, paths)])
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PFLOWER_SCHEMA_CACHE"] = str(tmp_path / "schema-cache")
    if plugins is not None:
        env[PLUGINS_ENV] = plugins
    return env


def _run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-c", textwrap.dedent(code)], env, cwd)


def _entry_point_site(site: Path) -> None:
    """A folder holding the tutorial's module and the dist-info of a package declaring it in
    the group ``pflower.plugins`` (what ``pip install`` would write)."""
    _tutorial_files(site)
    (site / "my-method" / "fedavg_step.py").rename(site / "fedavg_step.py")
    info = site / "fedavg_step_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fedavg-step-plugin\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nfedavg_step = fedavg_step\n")


# ---------------------------------------------------------------------------------- the API


def test_the_public_api_keeps_its_names() -> None:
    assert set(api.__all__) >= PUBLIC, sorted(PUBLIC - set(api.__all__))
    for name in api.__all__:
        assert getattr(api, name) is not None, name


def test_pflowers_own_algorithms_register_through_the_public_api() -> None:
    for algorithm in ALGORITHMS.values():
        module = sys.modules[algorithm.options.__module__]
        assert module.register_algorithm is api.register_algorithm, module.__name__


# ---------------------------------------------------------------------------------- loading


def test_plugins_come_from_the_variable_then_the_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    assert configured_plugins() == [] and fingerprint() == ""
    _entry_point_site(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PLUGINS_ENV, " first , fedavg_step,first")
    assert configured_plugins() == [
        Plugin("first", PLUGINS_ENV),
        Plugin("fedavg_step", PLUGINS_ENV),  # named twice: imported once
    ]
    monkeypatch.setenv(PLUGINS_ENV, "")
    assert configured_plugins() == [Plugin("fedavg_step", "entry point 'fedavg_step'")]
    # the fingerprint follows the plugin's source, read without importing it
    before = fingerprint()
    assert before and "fedavg_step" not in sys.modules
    source = tmp_path / "fedavg_step.py"
    source.write_text(source.read_text().replace("low=0.3", "low=0.2"))
    assert fingerprint() != before


def test_an_entry_point_plugin_loads_in_a_new_process(tmp_path: Path) -> None:
    _entry_point_site(tmp_path / "site")
    done = _python(
        """
        import pflower.strategies
        from pflower.core.algorithm import ALGORITHMS
        print(ALGORITHMS["fedavg_step"].options.display_name)
        """,
        _env(tmp_path, tmp_path / "site"),
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "FedAvg-step"


@pytest.mark.slow
@pytest.mark.parametrize(
    "command,module,source,cause",
    [
        (
            ["report", "--leaderboard", "."],
            "fedavg_stepp",
            "",
            "ModuleNotFoundError: No module named 'fedavg_stepp'",
        ),
        (
            ["dataset=digits", "rounds=1"],
            "twice",
            "from pflower.api import register_algorithm\n"
            "from fedavg_step import FedAvgStepClient, FedAvgStepOptions, FedAvgStepStrategy\n"
            "register_algorithm('fedavg', strategy=FedAvgStepStrategy, client=FedAvgStepClient)"
            "(FedAvgStepOptions)\n",
            "ValueError: strategy 'fedavg' is registered twice",
        ),
    ],
)
def test_a_plugin_that_fails_stops_the_command_with_one_line(
    tmp_path: Path, command: list[str], module: str, source: str, cause: str
) -> None:
    _tutorial_files(tmp_path)
    if source:
        (tmp_path / "my-method" / f"{module}.py").write_text(source)
    env = _env(tmp_path, tmp_path / "my-method", plugins=f"fedavg_step,{module}")
    done = _run(["pflower", *command], env, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip() == (
        f"plugin error: plugin '{module}' (from {PLUGINS_ENV}) failed to load: {cause}"
    )


@pytest.mark.slow
def test_the_check_before_imports_knows_a_plugins_options(tmp_path: Path) -> None:
    _tutorial_files(tmp_path)
    env = _env(tmp_path, tmp_path / "my-method", plugins="fedavg_step")
    written = _python(
        "from pflower.quickcheck import cache_file, write_schema_cache\n"
        "write_schema_cache()\nprint(cache_file())",
        env,
        tmp_path,
    )
    assert written.returncode == 0, written.stderr
    cache = Path(written.stdout.strip())
    assert "fedavg_step" in json.loads(cache.read_text())["options"]
    checked = _python(
        """
        import sys
        from pflower.quickcheck import cache_file, check_before_imports
        from pflower.registry import ConfigError

        check_before_imports(["strategy=fedavg_step", "strategy.server_lr=0.5"])
        try:
            check_before_imports(["strategy=fedavg_step", "strategy.nope=1"])
        except ConfigError as error:
            print(str(error).splitlines()[-1])
        print(cache_file().name, "torch" in sys.modules)
        """,
        env,
        tmp_path,
    )
    assert checked.returncode == 0, checked.stderr
    refusal, cached = checked.stdout.splitlines()
    assert refusal.endswith("Allowed keys: name, aggregation, server_lr"), refusal
    assert "'nope'" in refusal
    assert cached == f"{cache.name} False"
    # without the plugin, the cache of the same code is another file
    plain = _python(
        "from pflower.quickcheck import cache_file; print(cache_file())", _env(tmp_path), tmp_path
    )
    assert Path(plain.stdout.strip()) != cache


BLOCKS_PLUGIN = '''
"""A dataset, a partition scheme and a model registered through pflower.api."""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pflower.api import (
    DatasetBlock, ImageDataset, ImageSplit, IndexPartitioner, ModelBlock, PartitionBlock,
    register_dataset, register_model, register_partitioner,
)


@dataclass
class BlobsBlock(DatasetBlock):
    per_class: int = 40

    def data_shape(self):
        return (1, 4, 4), 2


@register_dataset("blobs", BlobsBlock)
def load_blobs(per_class=40, mean=None, std=None):
    generator = torch.Generator().manual_seed(0)

    def split(count):
        labels = torch.arange(2).repeat_interleave(count)
        noise = torch.randn(2 * count, 1, 4, 4, generator=generator)
        images = noise + 2.0 * labels[:, None, None, None]
        return ImageSplit(images, labels)

    return ImageDataset("blobs", split(per_class), split(per_class // 2), 2, (0.0,), (1.0,), 1.0)


@dataclass
class HalvesBlock(PartitionBlock):
    pass


class Halves(IndexPartitioner):
    def _partition(self, labels, groups, rng):
        return np.array_split(rng.permutation(len(labels)), self.num_partitions)


@register_partitioner("halves", HalvesBlock)
def halves(num_partitions, seed):
    return Halves(num_partitions, seed)


@dataclass
class TinyMlpBlock(ModelBlock):
    hidden: int = 8


class TinyMlp(nn.Module):
    head_module = "fc"

    def __init__(self, inputs, hidden, classes):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU())
        self.fc = nn.Linear(hidden, classes)

    def represent(self, x):
        return self.body(x)

    def forward(self, x):
        return self.fc(self.represent(x))


@register_model("tiny_mlp", TinyMlpBlock)
def tiny_mlp(input_shape, num_classes, hidden=8):
    return TinyMlp(int(np.prod(input_shape)), hidden, num_classes)
'''


@pytest.mark.slow
def test_a_plugin_dataset_partition_and_model_run(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "tiny_blocks.py").write_text(BLOCKS_PLUGIN)
    env = _env(tmp_path, tmp_path / "code", plugins="tiny_blocks")
    run = ["dataset=blobs", "partition=halves", "model=tiny_mlp", "model.hidden=4"]
    wrong = _run(["pflower", *run, "model.hiden=4"], env, tmp_path)
    assert wrong.returncode == 2 and "Allowed keys: name, hidden" in wrong.stdout, wrong.stdout
    done = _run(
        ["pflower", *run, "strategy=fedavg", "num_clients=2", "rounds=1", "output_dir=out"],
        env,
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["config"]["dataset"]["name"] == "blobs"
    assert summary["config"]["model"] == {"name": "tiny_mlp", "hidden": 4}
    assert summary["final"]["L1"]["acc_local"]["mean"] > 0.5


# ---------------------------------------------------------------------------------- the tutorial


def _deploy_ports(command: str) -> str:
    """``pflower deploy up`` on free ports (the tutorial's defaults may be taken)."""
    if not command.startswith("pflower deploy up"):
        return command
    return (
        f"{command} --fleet-port {free_port()} --control-port {free_port()} "
        f"--node-port {free_port_block(2)} --timeout 240"
    )


@pytest.mark.slow
@pytest.mark.deployment
@pytest.mark.timeout(2400)  # 10 pflower processes; about 15 minutes on a loaded 2-core machine
def test_the_tutorial_ranks_a_plugin_method_against_stored_runs(tmp_path: Path) -> None:
    _tutorial_files(tmp_path)
    blocks = BLOCK.findall(TUTORIAL.read_text())
    here = [body for where, body in blocks if not where]
    script = "\n".join(_deploy_ports(line) for body in here for line in body.splitlines())
    env = _env(tmp_path)
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        subprocess.run(["pflower", "deploy", "down", "--dir", "deployment"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "server_lr: 0.5" in done.stdout  # pflower --cfg job
    for run in ("runs/step", "runs/step_deployed"):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["status"] == "completed"
        assert summary["config"]["strategy"]["name"] == "fedavg_step"
    # the baseline ran once, before; the new method's command ran only the new method
    tuned = tmp_path / "tuning" / "mine" / "digits_iid"
    assert sorted(p.name for p in (tuned / "final").iterdir()) == ["fedavg", "fedavg_step"]
    log = [json.loads(line)["command"] for line in (tuned.parent / "commands.log").open()]
    assert [command[command.index("pflower tune") :] for command in log] == [
        "pflower tune --suite my-suite.yaml --out tuning/mine --workers 2",
        "pflower tune fedavg_step --suite my-suite.yaml --out tuning/mine --workers 2",
    ]
    board = (tuned.parent / "leaderboard.md").read_text()
    rows = [line for line in board.splitlines() if line.startswith("| 1 |")]
    assert {row.split(" | ")[2] for row in rows} <= {"FedAvg", "FedAvg-step"}
    assert "| FedAvg-step |" in board and "| FedAvg |" in board
    assert "digits_iid: FedAvg-step - FedAvg = " in done.stdout  # --compare
    assert "; 1 and 1 studies, 2 paired seeds)" in done.stdout

    # against the stored cpu runs, from the repository's root: refused, nothing written
    ((where, body),) = [(w, b) for w, b in blocks if w]
    assert where == "repository, exit 2"
    stored = ROOT / "results" / "tuning" / "cpu-v1"
    before = (stored / "commands.log").read_text()
    refused = _run(
        body.split(), _env(tmp_path, tmp_path / "my-method", plugins="fedavg_step"), ROOT
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "fedavg_step cannot be ranked against the stored runs in results/tuning/cpu-v1" in (
        refused.stderr
    )
    assert "what changed cannot be checked: all 33 stored methods" in refused.stderr
    assert "--trust-unchecked" in refused.stderr
    assert "another protocol than results/tuning/cpu-v1/suite.yaml's" in refused.stderr
    assert (stored / "commands.log").read_text() == before
