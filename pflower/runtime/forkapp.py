"""What a fork server's child runs ([`pflower.runtime.forkserver`][pflower.runtime.forkserver]): the
run's FAB, installed once per node, or per SuperLink for its ServerApps
([`install_fabs_once`][pflower.runtime.forkapp.install_fabs_once], Flower's
``install_from_fab`` in its ClientApp and ServerApp runtimes); the server's import of pflower,
kept only for a FAB with the same code
([`keep_app_if_unchanged`][pflower.runtime.forkapp.keep_app_if_unchanged], Flower's ``load_app``
as the two runtimes call it); and the configurations the children composed, prepared ahead by
the server ([`warm_configs`][pflower.runtime.forkapp.warm_configs]).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import logging
import os
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pflower.runtime.fence import (
    INSTALL_FROM_FAB,
    LOAD_APP,
    SERVERAPP_INSTALL_FROM_FAB,
)
from pflower.runtime.forkclient import SOCKET_VARIABLE, send_message
from pflower.runtime.internal import FlowerChanged, Internal

APP_PACKAGE = "pflower"
"""The package whose import the server keeps for its children."""


INSTALLED_FAB_MARK = ".pflower-fab-sha256"
"""File in an installed app's directory holding the SHA-256 of the FAB installed there, written
once the installation is complete
([`install_fabs_once`][pflower.runtime.forkapp.install_fabs_once])."""


def installed_fab(digest: str) -> Path | None:
    """The directory in which a task of this node installed the FAB whose SHA-256 is ``digest``
    (``$FLWR_HOME/apps/<publisher>.<name>.<version>.<digest[:8]>``, complete and marked with
    [`INSTALLED_FAB_MARK`][pflower.runtime.forkapp.INSTALLED_FAB_MARK]); None if there is none."""
    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    for path in (get_flwr_home() / APP_DIR).glob(f"*.{digest[:FAB_HASH_TRUNCATION]}"):
        with contextlib.suppress(OSError):
            if (path / INSTALLED_FAB_MARK).read_text() == digest:
                return path
    return None


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a concurrent reader (another task of the node) sees
    the whole text or no file, never part of it."""
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)


def install_fabs_once(install: Internal = INSTALL_FROM_FAB) -> None:
    """Make a ClientApp task skip installing a FAB that an earlier task of its node installed.

    ``flwr-clientapp`` installs the run's FAB at the start of every task: it unpacks the
    archive into a temporary directory and checks every file's hash (0.3-0.8 s for pflower's
    250 files on 2 cores), and only then finds the app installed already and returns its
    directory. This wraps ``install_from_fab`` in Flower's ClientApp runtime: FAB bytes whose
    SHA-256 (the whole digest, not the 8 characters of the directory's name) marks a complete
    installation return that directory at once; anything else is installed by Flower's
    function as before, and the installation is marked afterwards. The server calls this
    before it forks, so its children inherit the wrapper, for the server's life (``install``:
    `INSTALL_FROM_FAB`, the ClientApp runtime's;
    [`install_serverapp_fabs_once`][pflower.runtime.forkapp.install_serverapp_fabs_once] wraps
    the ServerApp runtime's).
    """
    original = install.current()

    def install_from_fab(
        fab_file: Path | bytes, install_dir: Path | None = None, skip_prompt: bool = False
    ) -> Path:
        if not isinstance(fab_file, bytes) or install_dir is not None:
            flowers: Path = original(fab_file, install_dir, skip_prompt)
            return flowers
        digest = hashlib.sha256(fab_file).hexdigest()
        installed = installed_fab(digest)
        if installed is not None:
            return installed
        path: Path = original(fab_file, install_dir, skip_prompt)
        write_atomically(path / INSTALLED_FAB_MARK, digest)
        return path

    install.replace_for_process(install_from_fab)


def install_serverapp_fabs_once() -> None:
    """[`install_fabs_once`][pflower.runtime.forkapp.install_fabs_once] for a SuperLink's
    ServerApps (`SERVERAPP_INSTALL_FROM_FAB`): ``flwr-serverapp`` installs the run's FAB the same
    way at the start of every run."""
    install_fabs_once(SERVERAPP_INSTALL_FROM_FAB)


def forget(package: str = APP_PACKAGE) -> None:
    """Drop ``package`` and its submodules from ``sys.modules`` (the next import reads them
    anew, from wherever ``sys.path`` finds them first), and the plugins that its next import
    loads ([`configured_plugins`][pflower.plugins.configured_plugins]): a plugin left imported
    would not run again, and so register nothing with the new import's registry."""
    from pflower.plugins import configured_plugins

    plugins = [plugin.module for plugin in configured_plugins()]
    for root in (package, *plugins):
        for name in [m for m in sys.modules if m == root or m.startswith(root + ".")]:
            del sys.modules[name]


def app_digest(package_dir: Path, conf_dir: Path) -> str:
    """A digest of an app's code and configuration
    ([`app_files`][pflower.config.base.app_files]), by path and content."""
    from pflower.config.base import app_files

    digest = hashlib.sha256()
    for relative, path in app_files(package_dir, conf_dir):
        digest.update(f"{relative}:".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


APP_DIGEST_FILE = ".pflower-app-digest"
"""File in an app directory installed by
[`install_fabs_once`][pflower.runtime.forkapp.install_fabs_once] that keeps its
[`app_digest`][pflower.runtime.forkapp.app_digest] (such a directory's files are the FAB's, so the
digest is computed once)."""


def installed_app_digest(root: Path, package: str = APP_PACKAGE) -> str:
    """[`app_digest`][pflower.runtime.forkapp.app_digest] of the app installed in ``root``
    (``package`` and ``conf``); read from
    and written to [`APP_DIGEST_FILE`][pflower.runtime.forkapp.APP_DIGEST_FILE] where
    [`install_fabs_once`][pflower.runtime.forkapp.install_fabs_once] marked ``root`` as a
    complete installation."""
    marked = (root / INSTALLED_FAB_MARK).is_file()
    if marked:
        with contextlib.suppress(OSError):
            return (root / APP_DIGEST_FILE).read_text()
    digest = app_digest(root / package, root / "conf")
    if marked:
        with contextlib.suppress(OSError):
            write_atomically(root / APP_DIGEST_FILE, digest)
    return digest


def loaded_app_digest(package: str = APP_PACKAGE) -> str | None:
    """[`app_digest`][pflower.runtime.forkapp.app_digest] of the imported ``package`` (None if it is
    not imported)."""
    if package not in sys.modules:
        return None
    try:
        from pflower.config import conf_dir

        return app_digest(Path(sys.modules[package].__file__ or "").parent, conf_dir())
    except Exception:  # no digest: the children import the app themselves
        return None


_app_kept = [True]
"""In a child: whether it still runs the server's import of the app."""


def configs_to_warm() -> list[list[str]]:
    """In a child that ran the server's import of the app: the configurations it composed
    (``pflower.compose.composed_overrides``), for the server to compose ahead."""
    compose = sys.modules.get(f"{APP_PACKAGE}.compose")
    if not _app_kept[0] or compose is None or not hasattr(compose, "composed_overrides"):
        return []
    return [list(overrides) for overrides in compose.composed_overrides()]


def send_warm_hint(overrides: list[list[str]]) -> None:
    """Ask the server (at [`SOCKET_VARIABLE`][pflower.runtime.forkapp.SOCKET_VARIABLE]) to compose
    ``overrides`` ahead; best effort."""
    path = os.environ.get(SOCKET_VARIABLE)
    if not overrides or not path:
        return
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(path)
        send_message(sock, {"kind": "warm", "overrides": overrides})


def warm_configs(overrides: list[list[str]]) -> None:
    """In the server: prepare the configurations not prepared yet (the app's
    ``prepare_ahead``: composed, their federation and model built), so the children forked from
    now on find them in the app's caches."""
    compose = sys.modules.get(f"{APP_PACKAGE}.compose")
    app = sys.modules.get(f"{APP_PACKAGE}.client.app")
    if compose is None or app is None or not hasattr(app, "prepare_ahead"):
        return
    known = set(compose.composed_overrides())
    for entry in overrides:
        if tuple(entry) in known:
            continue
        try:
            app.prepare_ahead([str(o) for o in entry])
        except Exception as error:  # the children prepare it themselves
            print(f"pflower fork server: not prepared ahead: {error!r}", file=sys.stderr)
    gc.freeze()


def keep_app_if_unchanged(
    loaded: str | None, package: str = APP_PACKAGE, load_app: Internal = LOAD_APP
) -> None:
    """In a child: keep the server's imported app only for a FAB with the same code.

    Flower loads the app with ``load_app(reference, error, project_dir)``, which imports the
    module from the FAB's directory unless it is imported already. This wraps that call
    (``load_app``: `LOAD_APP`, the ClientApp runtime's, or `SERVERAPP_LOAD_APP`, the ServerApp
    runtime's; for the child's life): if the FAB's ``package`` and ``conf`` have the digest
    ``loaded`` of the server's import, the imported modules are used as they are; otherwise (or
    if Flower's call is not the one known) they are forgotten first and the FAB's own code is
    imported, as in a new process.
    """
    try:
        load_app.check()
    except FlowerChanged:
        loaded = None
    if loaded is None:
        forget(package)
        _app_kept[0] = False
        return
    original = load_app.current()

    def kept_or_forgotten(
        reference: str, error_type: type[Exception], project_dir: object = None
    ) -> object:
        root = Path(str(project_dir)) if project_dir is not None else None
        if root is None or installed_app_digest(root, package) != loaded:
            forget(package)
            _app_kept[0] = False
        return original(reference, error_type, project_dir)

    load_app.replace_for_process(kept_or_forgotten)


# ------------------------------------------------------------------------------ the task
@dataclass
class Task:
    """What a child runs: the stand-in's command line, environment, directory and streams."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: dict[int, int] = field(default_factory=dict)
    """Standard stream number -> the received file descriptor to put there."""


def resolve(target: str) -> Callable[[], object]:
    """The function named ``module:function``."""
    module, _, name = target.partition(":")
    function: Callable[[], object] = getattr(importlib.import_module(module), name)
    return function


def run_task(
    task: Task, target: str, loaded_app: str | None = None, load_app: Internal = LOAD_APP
) -> None:
    """In the child: take over the stand-in's streams, environment, directory and command line,
    keep the server's import of the app for a FAB with its digest ``loaded_app``
    ([`keep_app_if_unchanged`][pflower.runtime.forkapp.keep_app_if_unchanged], through the
    program's ``load_app``), then call ``target``. The child ends with the exit status
    ``target`` leaves (as ``flwr-clientapp`` would), without tearing the interpreter down."""
    for number in (0, 1, 2):
        received = task.fds.get(number)
        if received is None:
            received = os.open(os.devnull, os.O_RDWR)
        if received != number:
            os.dup2(received, number)
            os.close(received)
    os.chdir(task.cwd)
    os.environ.clear()
    os.environ.update(task.env)
    sys.argv = list(task.argv)
    gc.enable()
    keep_app_if_unchanged(loaded_app, load_app=load_app)
    try:
        resolve(target)()
        code = 0
    except SystemExit as done:
        code = exit_code(done)
    except BaseException:
        traceback.print_exc()
        code = 1
    send_warm_hint(configs_to_warm())
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    # Not a normal interpreter exit: tearing down the modules inherited from the server would
    # write to (and so copy) every page of its heap, seconds of work for nothing.
    os._exit(code)


def exit_code(done: SystemExit) -> int:
    """The exit status Python gives a ``SystemExit`` (its message printed, if it has one)."""
    if done.code is None:
        return 0
    if isinstance(done.code, int):
        return done.code
    print(done.code, file=sys.stderr)
    return 1


def empty_task() -> None:
    """A task that does nothing: what a task costs the fork server and its child (the benchmark
    times it)."""
