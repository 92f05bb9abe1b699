"""Every symbol of Flower 1.39 (and of the Ray that Flower 1.39 pins) that pflower replaces, or
relies on outside Flower's API reference, and every private part of Optuna that ``pflower tune``
uses, in one table:
[`INTERNALS`][pflower.runtime.fence.INTERNALS].

Each entry names the symbol, the parameters pflower was written against (names and kinds; which
have defaults) and why pflower needs it. A replacement goes through
[`Internal.replaced`][pflower.runtime.internal.Internal.replaced] (a
context manager that puts the original back when the run ends) or, where the process exists for
the replacement's sake (the fork server, a SuperNode's launcher, a task's child),
[`Internal.replace_for_process`][pflower.runtime.internal.Internal.replace_for_process]
(`pflower.runtime.internal`). Both check the symbol first and fail with
[`FlowerChanged`][pflower.runtime.internal.FlowerChanged], naming it, if Flower changed it;
``tests/test_runtime_fence.py`` checks
every entry, so a Flower upgrade that moves one fails in one test with one message.

An entry that pflower replaces also records what the replacement saves, measured side by side
with the original (``measured``: ``benchmarks/fence_patches.py``), and the defaults it repeats or
relies on (``defaults``,
[`Internal.check_defaults`][pflower.runtime.internal.Internal.check_defaults]);
``tests/test_runtime_fence.py`` (``PATCH_TESTS``) has a test of the behaviour of each replaced
symbol that the replacement relies on, so a Flower change that keeps a signature but changes what
the function does fails too.
"""

from __future__ import annotations

from pflower.runtime.internal import Internal

_VCE = "flwr.server.superlink.fleet.vce.vce_api"

REGISTER_NODES = Internal(
    _VCE,
    "_register_nodes",
    "(num_nodes, state_factory)",
    "the simulation engine makes the node-id -> partition-id map there; pflower publishes it on "
    "the link state so the server need not ask every node (pflower.runtime.engine)",
    measured=(
        "the server does not ask every node for its partition before the first round: "
        "`pflower dataset=digits num_clients=200 rounds=1 fraction=0.02`, 2 alternating pairs, "
        "the run's wall_time_s 16.7 and 13.5 s without it, 7.7 and 6.9 s with it (same rows)"
    ),
)
ADD_MESSAGES_TO_QUEUE = Internal(
    _VCE,
    "add_messages_to_queue",
    "(state, queue, nodes_mapping, f_stop)",
    "Flower's delivery loop scans every stored message for every node every 0.1 s; pflower's "
    "asks only for the nodes with an undelivered message (pflower.runtime.engine)",
    measured=(
        "one pass of the delivery loop at 10,000 nodes with a round's 100 messages stored: 1.78 "
        "s of Flower's loop, which runs every 0.1 s (a core kept busy), 0.0007 s of pflower's"
    ),
)
START_VCE = Internal(
    _VCE,
    "start_vce",
    "(backend_name, backend_config_json_stream, app_dir, is_app, f_stop, run, metrics, "
    "client_app=..., client_app_attr=..., num_supernodes=..., state_factory=..., "
    "existing_nodes_mapping=...)",
    "it imports RayBackend from the raybackend module when the engine starts, the module that "
    "backend=fork stands in for (pflower.runtime.forkbackend)",
)
RAY_BACKEND = Internal(
    "flwr.server.superlink.fleet.vce.backend.raybackend",
    "RayBackend",
    "(backend_config)",
    "backend=fork replaces this backend class, constructed as RayBackend(backend_config), by "
    "ForkBackend (pflower.runtime.forkbackend)",
    measured=(
        "backend=fork starts no Ray: Ray's start alone (RayBackend.init_ray) took 40.6 s, 19.1 "
        "s with a lean head"
    ),
)
BACKEND = Internal(
    "flwr.server.superlink.fleet.vce.backend.backend",
    "Backend",
    "(backend_config)",
    "ForkBackend implements this interface of the simulation engine's backends",
)
CLIENT_APP_EXCEPTION = Internal(
    "flwr.clientapp.client_app",
    "ClientAppException",
    "(message)",
    "a fork worker's failed ClientApp is raised as this, which the engine turns into an error "
    "reply, as for a Ray actor",
)
RUN_SIMULATION = Internal(
    "flwr.simulation.run_simulation",
    "_run_simulation",
    "(num_supernodes, exit_event, client_app=..., server_app=..., backend_name=..., "
    "backend_config=..., client_app_attr=..., server_app_attr=..., server_app_context=..., "
    "app_dir=..., run=..., enable_tf_gpu_growth=..., verbose_logging=..., is_app=..., "
    "metrics=...)",
    "the public run_simulation takes no run config; this is the call that `flwr run`'s "
    "simulation runtime makes, with the app directory for the config's defaults",
)
FUSED_CONFIG = Internal(
    "flwr.common.config",
    "get_fused_config_from_dir",
    "(project_dir, override_config)",
    "the run config a simulation's apps see: the app's declared defaults fused with overrides",
)
EMPTY_RUN = Internal(
    "flwr.supercore.run",
    "Run.create_empty",
    "(run_id)",
    "the Run that _run_simulation is given (its id, config and federation)",
)
RAY_START_MONITOR = Internal(
    "ray._private.node",
    "Node.start_monitor",
    "(self)",
    "it starts Ray's autoscaler monitor, which a one-node simulation does not use (about 1.5 s "
    "and 60 MB of ray.init on 2 cores; Ray has no public switch)",
    measured=(
        "RayBackend.init_ray took 19.1 s instead of 40.6 s (with RAY_START_API_SERVER; 3 pairs, "
        "14.7-22.6 s against 21.0-49.8 s)"
    ),
)
RAY_START_API_SERVER = Internal(
    "ray._private.node",
    "Node.start_api_server",
    "(self, *, include_dashboard, raise_on_failure)",
    "it starts Ray's API server, which with include_dashboard=False serves only usage "
    "statistics, and ray.init waits for it (Ray has no public switch)",
    measured=("see RAY_START_MONITOR: the two together halve Ray's start"),
)
RAY_INIT = Internal(
    "flwr.server.superlink.fleet.vce.backend.raybackend",
    "RayBackend.init_ray",
    "(self, backend_config)",
    "its ray.init replaces the driver's SIGTERM handler by Ray's sys.exit, so a Ray run stopped "
    "by `kill` recorded nothing and hung; pflower puts its handler back after it "
    "(pflower.runtime.engine.ray_keeps_signal_handlers)",
    measured=(
        "a failure: after Flower's init_ray the process's SIGTERM handler was Ray's (3 of 3), "
        "after pflower's its own (3 of 3), so `kill` of a Ray run records it"
    ),
)
RAY_ADDRESS_FILE = Internal(
    "ray._common.utils",
    "get_ray_address_file",
    "(temp_dir)",
    "it names Ray's record of the last `ray start` cluster, which ray.init() attaches to; a "
    "dead cluster's record hung every Ray-backed run, so pflower reads it first "
    "(pflower.runtime.raycluster)",
)
IN_MEMORY_GRID = Internal(
    "flwr.superlink.grid.inmemory_grid",
    "InMemoryGrid",
    "(state_factory, pull_interval=...)",
    "a simulation's nodes are reached through it (how the server knows it is in a simulation, "
    "and where it finds the published partitions)",
    defaults=(("pull_interval", 0.1),),
)
HTTP_GRID_SEND_AND_RECEIVE = Internal(
    "flwr.superlink.grid",
    "HttpGrid.send_and_receive",
    "(self, messages, *, timeout=...)",
    "PromptGrid keeps its contract (push, pull until all replied or timeout) with shorter "
    "pauses than its 3 s (pflower.runtime.polling)",
    measured=(
        "a reply that arrives 0.1 s after the push is received after 3.01 s by Flower's loop, "
        "0.12 s by PromptGrid's"
    ),
    defaults=(("timeout", None),),
)
GRID_CLIENT_PROXY = Internal(
    "flwr.server.compat.grid_client_proxy",
    "GridClientProxy",
    "(node_id, grid, run_id)",
    "the legacy server's proxy of a node; pflower swaps its grid for a PromptGrid "
    "(pflower.runtime.polling)",
    measured=(
        "as HTTP_GRID_SEND_AND_RECEIVE: the grid swapped in is PromptGrid (3.01 s -> 0.12 s per "
        "reply)"
    ),
)
FIT_CLIENTS = Internal(
    "flwr.server.server",
    "fit_clients",
    "(client_instructions, max_workers, timeout, group_id)",
    "the legacy server loop's fit phase (one thread per client), which pflower's checkpointing "
    "loop uses outside a deployment (pflower.server.loop, through pflower.runtime.polling)",
)
EVALUATE_CLIENTS = Internal(
    "flwr.server.server",
    "evaluate_clients",
    "(client_instructions, max_workers, timeout, group_id)",
    "the legacy server loop's evaluate phase, used as fit_clients is",
)
OBJECT_PUSH_ERROR = Internal(
    "flwr.supercore.inflatable.inflatable_utils",
    "ObjectPushError",
    "(object_id, run_id, session_id)",
    "raised when the SuperLink did not store a pushed object; the roster's questions for the "
    "nodes' partitions are pushed again on it (pflower.runtime.polling.ask_properties_at_once)",
)
PULL_OBJECTS = Internal(
    "flwr.supercore.inflatable.inflatable_utils",
    "pull_objects",
    "(object_ids, pull_object_fn, *, max_concurrent_pulls=..., max_time=..., "
    "max_tries_per_object=..., initial_backoff=..., backoff_cap=...)",
    "its initial_backoff (1 s) delays every array a message announced before it was stored; "
    "pflower changes the default (pflower.runtime.polling.prompt_object_pulls)",
    measured=(
        "an array stored 0.1 s after the first ask is pulled after 1.09 s with Flower's "
        "backoff, 0.16 s with pflower's"
    ),
    defaults=(("initial_backoff", 1), ("backoff_cap", 10)),
)
PULL_AND_INFLATE = Internal(
    "flwr.supercore.inflatable.inflatable_utils",
    "pull_and_inflate_object_from_tree",
    "(object_tree, pull_object_fn, confirm_object_received_fn, *, return_type=..., "
    "max_concurrent_pulls=..., max_time=..., max_tries_per_object=..., initial_backoff=..., "
    "backoff_cap=...)",
    "as pull_objects: its backoff defaults are changed (pflower.runtime.polling)",
    measured=(
        "as PULL_OBJECTS (1.09 s -> 0.16 s per array not there yet); it passes its own defaults on"
    ),
    defaults=(("initial_backoff", 1), ("backoff_cap", 10)),
)
INSTALL_FROM_FAB = Internal(
    "flwr.supernode.runtime.run_clientapp",
    "install_from_fab",
    "(fab_file, install_dir=..., skip_prompt=...)",
    "every ClientApp task unpacks and checks the run's FAB again (0.3-0.8 s); the fork server "
    "returns a complete earlier installation at once (pflower.runtime.forkapp)",
    measured=(
        "pflower's own FAB, installed already: 10.7 s of Flower's install_from_fab per "
        "ClientApp task, 0.03 s"
    ),
    defaults=(("install_dir", None), ("skip_prompt", False)),
)
LOAD_APP = Internal(
    "flwr.clientapp.utils",
    "load_app",
    "(module_attribute_str, error_type, project_dir=...)",
    "a fork server's child keeps the server's import of pflower only for a FAB with the same "
    "code (pflower.runtime.forkapp)",
    measured=(
        "a task that imported pflower's ClientApp again took 6.39 s; one that keeps the "
        "server's, 0.0001 s"
    ),
    defaults=(("project_dir", None),),
)
SERVERAPP_INSTALL_FROM_FAB = Internal(
    "flwr.superlink.runtime.run_serverapp",
    "install_from_fab",
    "(fab_file, install_dir=..., skip_prompt=...)",
    "every run's ServerApp unpacks and checks the run's FAB again, as a ClientApp task does "
    "(INSTALL_FROM_FAB, the same function); the ServerApp fork server returns a complete "
    "earlier installation at once (pflower.runtime.forkapp)",
    measured=(
        "pflower's own FAB, installed already: 0.128 s of Flower's install_from_fab per run's "
        "ServerApp, 0.0017 s (benchmarks/fence_patches.py, 3 pairs, 2026-12-07, 2 cores)"
    ),
    defaults=(("install_dir", None), ("skip_prompt", False)),
)
SERVERAPP_LOAD_APP = Internal(
    "flwr.server.run_serverapp",
    "load_app",
    "(module_attribute_str, error_type, project_dir=...)",
    "a ServerApp fork server's child keeps the server's import of pflower only for a FAB with "
    "the same code, as a ClientApp task's does (LOAD_APP, the same function; "
    "pflower.runtime.forkapp)",
    measured=(
        "a ServerApp child that imported pflower's ServerApp again (torch and Flower imported "
        "already) took 1.01 s; one that keeps the server's, 0.0002 s"
    ),
    defaults=(("project_dir", None),),
)
FLWR_SERVERAPP = Internal(
    "flwr.superlink.cli.flwr_serverapp",
    "flwr_serverapp",
    "()",
    "the flwr-serverapp entry point that a ServerApp fork server's child runs",
)
FLOWER_SUPERLINK = Internal(
    "flwr.superlink.cli.flower_superlink",
    "flower_superlink",
    "()",
    "the flower-superlink entry point that pflower's launcher runs in its own process",
)
FLWR_CLIENTAPP = Internal(
    "flwr.supernode.cli.flwr_clientapp",
    "flwr_clientapp",
    "()",
    "the flwr-clientapp entry point that a fork server's child runs",
)
FLOWER_SUPERNODE = Internal(
    "flwr.supernode.cli.flower_supernode",
    "flower_supernode",
    "()",
    "the flower-supernode entry point that pflower's launcher runs in its own process",
)
FLOWER_SUPEREXEC = Internal(
    "flwr.supercore.cli.flower_superexec",
    "flower_superexec",
    "()",
    "the flower-superexec entry point that pflower's launcher runs in its own process",
)
SUPERNODE_TIME = Internal(
    "flwr.supernode.start_client_internal",
    "time",
    None,
    "the SuperNode's message loop sleeps 3 s / 0.5 s through this module's time.sleep, with no "
    "setting; the launcher gives the loop a capped sleep (pflower.runtime.launcher)",
    measured=(
        "a ClientApp reply ready 0.1 s after the SuperNode looks is sent after 0.53 s by "
        "Flower's loop, 0.11 s with the cap (and a message waits up to 0.1 s instead of 3 s "
        "idle)"
    ),
)
CONSOLE_HANDLER = Internal(
    "flwr.supercore.logger",
    "update_console_handler",
    "(level=..., timestamps=..., colored=...)",
    "the live view shows only Flower's warnings on the console (pflower.runtime.logs)",
)
CONSOLE_HANDLER_CLASS = Internal(
    "flwr.supercore.logger",
    "ConsoleHandler",
    "(timestamps=..., json=..., colored=..., stream=...)",
    "it colours every line unconditionally; pflower sets its colored attribute off where the "
    "stream is no terminal (pflower.runtime.logs)",
    measured=(
        "a failure: 900 bytes of colour escapes per 100 log lines in a log that is no terminal, "
        "0 with colored off"
    ),
    defaults=(("colored", True),),
)

_OPTUNA = "Optuna 5.1 (optuna>=4)"
_OPTUNA_RDB = "optuna.storages._rdb.storage"

OPTUNA_RECORD_HEARTBEAT = Internal(
    _OPTUNA_RDB,
    "RDBStorage.record_heartbeat",
    "(self, trial_id)",
    "`pflower tune` runs trials with ask and tell, so it records their heartbeats itself, "
    "through the study's storage (Study._storage) by the trial's id (Trial._trial_id) "
    "(pflower.runtime.optuna_storage)",
    _OPTUNA,
)
OPTUNA_GET_TRIAL = Internal(
    _OPTUNA_RDB,
    "RDBStorage.get_trial",
    "(self, trial_id)",
    "a trial refused before its run started is re-enqueued by Optuna's heartbeat-stale callback, "
    "which takes the trial as stored (pflower.runtime.optuna_storage)",
    _OPTUNA,
)
OPTUNA_ALL_TRIALS = Internal(
    _OPTUNA_RDB,
    "RDBStorage.get_all_trials",
    "(self, study_id, deepcopy=..., states=...)",
    "a study's budget counts the trials of every `pflower tune` process sharing it, read past "
    "the per-process cache (_CachedStorage._backend) by the study's id (Study._study_id) "
    "(pflower.runtime.optuna_storage)",
    _OPTUNA,
)
OPTUNA_FAIL_TRIAL = Internal(
    _OPTUNA_RDB,
    "RDBStorage.set_trial_state_values",
    "(self, trial_id, state, values=...)",
    "a trial left RUNNING by a stopped `pflower tune` is failed as soon as no driver holds the "
    "setting, as fail_stale_trials fails a late heartbeat's, by the trial's id "
    "(pflower.runtime.optuna_storage.fail_running_trials)",
    _OPTUNA,
)

INTERNALS: tuple[Internal, ...] = (
    REGISTER_NODES,
    ADD_MESSAGES_TO_QUEUE,
    START_VCE,
    RAY_BACKEND,
    BACKEND,
    CLIENT_APP_EXCEPTION,
    RUN_SIMULATION,
    FUSED_CONFIG,
    EMPTY_RUN,
    RAY_START_MONITOR,
    RAY_START_API_SERVER,
    RAY_INIT,
    RAY_ADDRESS_FILE,
    IN_MEMORY_GRID,
    HTTP_GRID_SEND_AND_RECEIVE,
    GRID_CLIENT_PROXY,
    FIT_CLIENTS,
    EVALUATE_CLIENTS,
    OBJECT_PUSH_ERROR,
    PULL_OBJECTS,
    PULL_AND_INFLATE,
    INSTALL_FROM_FAB,
    LOAD_APP,
    SERVERAPP_INSTALL_FROM_FAB,
    SERVERAPP_LOAD_APP,
    FLWR_CLIENTAPP,
    FLWR_SERVERAPP,
    FLOWER_SUPERLINK,
    FLOWER_SUPERNODE,
    FLOWER_SUPEREXEC,
    SUPERNODE_TIME,
    CONSOLE_HANDLER,
    CONSOLE_HANDLER_CLASS,
    OPTUNA_RECORD_HEARTBEAT,
    OPTUNA_GET_TRIAL,
    OPTUNA_ALL_TRIALS,
    OPTUNA_FAIL_TRIAL,
)
"""Every Flower/Ray/Optuna internal pflower uses (``tests/test_runtime_fence.py`` checks each)."""
