"""The only part of pflower that touches Flower's, Ray's or Optuna's internals (anything outside
Flower's API reference, and their private modules and attributes): an import-linter contract in
``pyproject.toml`` (``fenced_externals``) fails any other module of pflower that imports one, and
``tests/test_fence_scan.py`` any that reads a private or string-named attribute.

[`fence`][pflower.runtime.fence] lists every internal symbol used, the parameters pflower was
written against and why it is used (``tests/test_runtime_fence.py`` checks each, so a Flower
change fails in one test with one message); every replacement goes through it and is undone at
the end of the run where the process outlives the run.

- [`engine`][pflower.runtime.engine]: Flower's simulation engine as pflower starts it (the private
  ``_run_simulation``), its message delivery and node registration replaced for the run, Ray's
  head node started without its monitor and API server.
- [`forkbackend`][pflower.runtime.forkbackend]: ``backend=fork``, the engine's backend over
  processes
  forked from the driver (Flower's Ray backend module stood in for during the run).
- [`polling`][pflower.runtime.polling] and [`packing`][pflower.runtime.packing]: a deployment's
  ServerApp
  pushes a round's messages at once, with packed arrays, and polls for replies promptly.
- [`launcher`][pflower.runtime.launcher], [`forkserver`][pflower.runtime.forkserver],
  [`forkapp`][pflower.runtime.forkapp], [`forkclient`][pflower.runtime.forkclient]: a deployment's
  SuperNode
  with short polls and a ClientApp fork server (``python -m pflower.deploy.launcher`` is the
  public entry point).
- [`processes`][pflower.runtime.processes]: every process pflower forks dies with its parent.
- [`signals`][pflower.runtime.signals]: a signal caught by a thread other than the main one is
  handled at once, though the main thread waits in the simulation engine.
- [`logs`][pflower.runtime.logs]: Flower's console logging.
- [`optuna_storage`][pflower.runtime.optuna_storage]: a tuning trial's heartbeat and a shared
  study's trials, from Optuna's storage.
"""
