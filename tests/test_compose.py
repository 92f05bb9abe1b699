"""docker/compose.yml and its overlays, checked without a Docker engine.

- the committed files are exactly what ``pflower deploy compose`` generates (no hand edits that
  drift from the local topology);
- every service's command uses only options that the installed Flower executable accepts, read
  from its ``--help``, with a value exactly where the option takes one; services started through
  pflower's launcher are checked against the Flower executable it runs, and every ClientApp
  executor (only those) gets its fork server;
- ports, node configs, runtime addresses, certificates and volumes agree with one another, for
  the committed 3-client files and for a generated 5-client set;
- ``docker/certs.sh`` writes the files the TLS overlay mounts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from copy import deepcopy
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from pflower.deploy import launcher
from pflower.deploy.compose import COMPOSE_FILES, render_compose
from pflower.deploy.processes import executable

DOCKER = Path(__file__).resolve().parents[1] / "docker"
BASE, TLS, GPU = "compose.yml", "with-tls.yml", "with-gpu.yml"
FLOWER_EXECUTABLES = ("flower-superlink", "flower-supernode", "flower-superexec")


# ----------------------------------------------------------------------- Flower's options
@dataclass(frozen=True)
class Option:
    """One option of a Flower executable: whether it takes a value, and its choices."""

    takes_value: bool
    choices: tuple[str, ...] = ()


@cache
def accepted_options(program: str) -> dict[str, Option]:
    """The long options in the usage of ``<program> --help`` (the installed executable)."""
    help_text = subprocess.run(
        [executable(program), "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    usage = help_text.split("\n\n", 1)[0]
    options = {}
    for name, value in re.findall(
        r"(--[a-z][a-z0-9-]*)(?:[ =](\{[^}]*\}|[A-Z][A-Z0-9_]*))?", usage
    ):
        choices = tuple(value.strip("{}").split(",")) if value.startswith("{") else ()
        options[name] = Option(takes_value=bool(value), choices=choices)
    assert options, f"no options found in `{program} --help`"
    return options


def parse_command(program: str, command: list[str]) -> dict[str, str | None]:
    """The options of ``command`` (value or None), failing on anything ``program`` rejects."""
    accepted = accepted_options(program)
    parsed: dict[str, str | None] = {}
    tokens = iter(command)
    for token in tokens:
        assert token.startswith("--"), f"{program}: unexpected positional argument {token!r}"
        name, has_inline, inline = token.partition("=")
        assert name in accepted, f"{program} does not accept {name}"
        option = accepted[name]
        if not option.takes_value:
            assert not has_inline, f"{program} {name} takes no value"
            parsed[name] = None
            continue
        value = inline if has_inline else next(tokens, None)
        assert value is not None and not value.startswith("--"), f"{program} {name} needs a value"
        if option.choices:
            assert value in option.choices, f"{program} {name}: {value!r} not in {option.choices}"
        parsed[name] = value
    return parsed


# --------------------------------------------------------------------------- compose model
def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge of an overlay, for the keys these files use.

    ``command``/``entrypoint``/``image`` replace, mappings merge, ``volumes`` merge by mount
    target, other lists are concatenated.
    """
    merged = deepcopy(base)
    for name, service in overlay.get("services", {}).items():
        target = merged["services"].setdefault(name, {})
        for key, value in service.items():
            if key == "volumes":
                mounts = {_mount_target(v): v for v in target.get("volumes", [])}
                mounts.update({_mount_target(v): v for v in value})
                target["volumes"] = list(mounts.values())
            elif isinstance(value, dict) and isinstance(target.get(key), dict):
                target[key] = {**target[key], **value}
            else:
                target[key] = deepcopy(value)
    merged.setdefault("volumes", {}).update(overlay.get("volumes", {}))
    return merged


def _mount_target(volume: str) -> str:
    return volume.split(":")[1]


def _named_volumes(service: dict[str, Any]) -> dict[str, str]:
    """Named volumes of a service (not bind mounts), by name: their mount targets."""
    named = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if not source.startswith((".", "/")):
            named[source] = target
    return named


def _binds(service: dict[str, Any]) -> dict[str, str]:
    """Bind mounts of a service: container path -> host path."""
    binds = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            binds[target] = source
    return binds


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


LAUNCHER = ["python", "-m", "pflower.deploy.launcher"]


def flower_program(name: str, entrypoint: list[str]) -> str:
    """The Flower executable a service's ``entrypoint`` runs, directly or through the launcher
    (which starts a fork server exactly for ClientApp executors)."""
    if entrypoint[: len(LAUNCHER)] == LAUNCHER:
        component, fork_server, rest = launcher.parse(entrypoint[len(LAUNCHER) :])
        assert rest == [], f"{name}: Flower's arguments belong in `command`"
        assert fork_server == name.startswith("clientapp-"), f"{name}: fork server {fork_server}"
        program = f"flower-{component}"
    else:
        (program,) = entrypoint
    assert program in FLOWER_EXECUTABLES, f"{name} runs {program}, not a Flower executable"
    return program


def services_of(config: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, str | None]]]:
    """(service, Flower executable, parsed options) of every service."""
    for name, service in config["services"].items():
        program = flower_program(name, [str(t) for t in service["entrypoint"]])
        yield name, program, parse_command(program, [str(t) for t in service["command"]])


def check_topology(config: dict[str, Any], tls: bool) -> None:
    """Assert that ports, node configs, runtime addresses and volumes fit together."""
    services = config["services"]
    options = {name: parsed for name, _, parsed in services_of(config)}
    nodes = sorted(n for n in services if n.startswith("supernode-"))
    num_nodes = len(nodes)
    assert num_nodes >= 1
    assert set(services) == {
        "superlink",
        "serverapp",
        *nodes,
        *(f"clientapp-{i}" for i in range(num_nodes)),
    }

    link = options["superlink"]
    _, fleet_port = _host_port(str(link["--fleet-api-address"]))
    control_port = int(str(link["--port"]))
    assert link["--isolation"] == "process", "the ServerApp runs in the serverapp service"
    published = {int(p.split(":")[1]) for p in services["superlink"]["ports"]}
    assert {fleet_port, control_port} <= published
    database_dir = str(Path(str(link["--database"])).parent)
    assert database_dir in _named_volumes(services["superlink"]).values(), "state not on a volume"
    assert options["serverapp"]["--runtime-api-address"] == f"superlink:{control_port}"

    partitions = set()
    node_data = set()
    for index in range(num_nodes):
        node, executor = f"supernode-{index}", f"clientapp-{index}"
        parsed = options[node]
        assert parsed["--superlink"] == f"superlink:{fleet_port}"
        assert parsed["--isolation"] == "process", f"{node}'s ClientApps run in {executor}"
        assert parsed["--host"] == "0.0.0.0", f"{executor} must reach {node}'s runtime API"
        config_pairs = dict(p.split("=") for p in str(parsed["--node-config"]).split())
        assert config_pairs == {
            "partition-id": str(index),
            "num-partitions": str(num_nodes),
            "client-state-dir": '"/home/app/client-state"',  # where its clients' state persists
        }
        partitions.add(index)
        runtime_port = int(str(parsed["--port"]))
        assert options[executor]["--runtime-api-address"] == f"{node}:{runtime_port}"
        assert node in services[executor]["depends_on"]
        data = _named_volumes(services[executor])
        assert len(data) == 1, f"{executor} needs exactly one data volume"
        ((volume, target),) = data.items()
        assert services[executor]["environment"]["PFLOWER_DATA"] == target
        assert _named_volumes(services[node]) == data, f"{node} and {executor} share one site"
        node_data.add(volume)
    assert partitions == set(range(num_nodes))
    assert len(node_data) == num_nodes, "every node has a data volume of its own"

    server_volumes = _named_volumes(services["serverapp"])
    assert services["serverapp"]["environment"]["PFLOWER_DATA"] in server_volumes.values()
    assert not node_data & set(server_volumes)
    used = {v for s in services.values() for v in _named_volumes(s)}
    assert used == set(config["volumes"]), "declared and used volumes differ"

    insecure = [n for n, parsed in options.items() if "--insecure" in parsed]
    if not tls:
        assert sorted(insecure) == sorted(options), "without TLS every service says --insecure"
        return
    assert sorted(insecure) == sorted(f"clientapp-{i}" for i in range(num_nodes)), (
        "with TLS only the ClientApp executors (same-site runtime API) stay unencrypted"
    )
    assert "--enable-supernode-auth" in link
    for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
        assert str(link[flag]) in _binds(services["superlink"])
    assert str(options["serverapp"]["--root-certificates"]) in _binds(services["serverapp"])
    for node in nodes:
        binds = _binds(services[node])
        assert str(options[node]["--root-certificates"]) in binds
        key = str(options[node]["--auth-supernode-private-key"])
        assert binds[key] == f"./certs/{node}", f"{node} must use its own key"


def check_gpu(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        if not name.startswith("clientapp-"):
            continue
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert any("gpu" in d["capabilities"] for d in devices), f"{name} reserves no GPU"
        assert service["build"]["args"]["VARIANT"] == "cuda"


# ------------------------------------------------------------------------------------ tests
def _load(texts: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {name: yaml.safe_load(text) for name, text in texts.items()}


@pytest.fixture(params=[3, 5], ids=["committed-3-clients", "generated-5-clients"])
def compose(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    if request.param == 3:
        return _load({name: (DOCKER / name).read_text() for name in COMPOSE_FILES})
    return _load(render_compose(request.param))


def test_committed_files_are_generated() -> None:
    expected = render_compose(3)
    for name, text in expected.items():
        assert (DOCKER / name).read_text() == text, (
            f"docker/{name} differs from `pflower deploy compose --num-clients 3`"
        )


def test_base_topology(compose: dict[str, dict[str, Any]]) -> None:
    check_topology(compose[BASE], tls=False)


def test_tls_overlay(compose: dict[str, dict[str, Any]]) -> None:
    check_topology(merge(compose[BASE], compose[TLS]), tls=True)


def test_gpu_overlay(compose: dict[str, dict[str, Any]]) -> None:
    merged = merge(merge(compose[BASE], compose[TLS]), compose[GPU])
    check_topology(merged, tls=True)
    check_gpu(merged)


def test_option_checker_rejects_unknown_and_malformed_flags() -> None:
    with pytest.raises(AssertionError, match="does not accept"):
        parse_command("flower-supernode", ["--clientappio-api-address", "0.0.0.0:9094"])
    with pytest.raises(AssertionError, match="needs a value"):
        parse_command("flower-superlink", ["--database", "--insecure"])
    with pytest.raises(AssertionError, match="not in"):
        parse_command("flower-supernode", ["--isolation", "thread"])


@pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
    reason="docker/certs.sh needs openssl and ssh-keygen",
)
def test_certs_script_makes_what_the_tls_overlay_mounts(tmp_path: Path) -> None:
    subprocess.run(
        [str(DOCKER / "certs.sh"), "-o", str(tmp_path), "-n", "3"], check=True, capture_output=True
    )
    overlay = yaml.safe_load((DOCKER / TLS).read_text())
    mounted = {
        source for service in overlay["services"].values() for source in _binds(service).values()
    }
    assert mounted, "the TLS overlay mounts no certificates"
    for source in mounted:
        assert (tmp_path / Path(source).relative_to("certs")).is_file(), source


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="the docker compose plugin is not installed",
)
def test_docker_compose_accepts_the_files() -> None:
    files = [arg for name in (BASE, TLS, GPU) for arg in ("-f", str(DOCKER / name))]
    subprocess.run(
        ["docker", "compose", *files, "config", "--quiet"],
        check=True,
        capture_output=True,
        cwd=DOCKER,
    )
