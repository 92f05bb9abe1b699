"""pflower on a GPU against a bare PyTorch loop on the same GPU, and how concurrent clients scale.

Three measurements, each a set of cases; every run records its time per round, images per
second and the GPU's utilization and memory (sampled with NVML: ``pynvml`` when installed, else
``nvidia-smi``; absent without a GPU):

1. **pflower against its floor** (``--cases``; skip with ``--no-floor``). Each case is a paper's
   full-scale preset (``+experiment=<paper>_paper``: its dataset, model, clients, local epochs
   and batch size; ``resnet18-cifar`` is FedMPR's ResNet-18 on synthetic data of CIFAR-10's
   shape, 50,000 + 10,000 images of 3x32x32: timing needs the shapes, not the images). It runs
   (a) as the real ``pflower`` command with ``train.device=<device>`` on forked workers (the
   default backend; ``--backend ray`` for Ray's actors with ``--clients-per-gpu`` clients per
   GPU), evaluation only after the last round (``eval.every=1000``: the rounds timed are
   training rounds); and (b) as the **floor**: one process with one model on the same device
   running plain loops over the same clients, each from the round's global model with a fresh
   optimizer of the preset's ``train.*`` settings, over the same mini-batches in the same
   order (pflower's per-round, per-client seeds), for the same number of epochs and rounds,
   then FedAvg of the weights on the device. Round time = between the ends of consecutive
   training phases (pflower: the metrics.jsonl ``time`` rows; the floor: the device
   synchronized at each round's end); steady = median of rounds 3..R (``STEADY_INTERVALS``: the
   first round carries start-up and CUDA/cuDNN initialization, the second an algorithm's
   one-off work such as FedALA's start phase). Images per round = the training samples the
   floor drew (the same batches as pflower's). The ratio pflower / floor is of steady rounds;
   it includes the algorithm's own work on top of plain SGD (FedALA's ALA, FLAME's and
   DiversiFed's extra terms): ``--set strategy=fedavg`` measures the framework alone.
2. **Concurrency scaling** (``--scaling-cases``, ``--workers``): FLAME's MLP (``flame``) and
   FedALA's CNN (``fedala-cnn``: the FedALA preset with FedAvg, so that round 2 carries no ALA
   start phase) on pflower's forked workers, ``backend.workers=W`` for each W: W clients train
   concurrently on the one device. Reported: steady round, rounds per second and the speed-up
   over W = 1 (one client at a time).
3. Anything else through ``--set`` (e.g. ``--set train.amp=bf16 train.channels_last=true``,
   applied to pflower and the floor alike, or ``train.data_on_device=true``).

``--smoke`` shrinks every case to a tiny synthetic federation (2 clients, a few hundred 16x16
images, 3 rounds) so that ``--device cpu --smoke`` checks the script end to end on any machine
(``tests/test_gpu_benchmark.py``). Without a CUDA device, ``--device cuda`` says so and exits 2
before running anything. ``benchmarks/gpu_all.sh`` runs every GPU measurement in one call,
bounded in time.

Usage::

    python benchmarks/gpu.py [--cases fliu fedala flame fedmpr diversifed resnet18-cifar]
        [--scaling-cases flame fedala-cnn] [--workers 1 2 4 8 16] [--no-floor]
        [--rounds 4] [--backend fork|ray] [--clients-per-gpu 4] [--device cuda|cpu]
        [--smoke] [--out DIR] [--case-limit SECONDS] [--set KEY=VALUE ...]

Writes ``gpu.json`` (every run in full, appended) and appends rows to the tables of ``gpu.md`` in
the output folder (one table per measurement). With ``--case-limit``, a pflower run or a floor
still running after that many seconds is stopped, and its row says how far it got.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() without a context
import torch
from overhead import RunUnfinished, append_row, machine_description, run_pflower

STEADY_INTERVALS = slice(1, None)
"""Round intervals of the steady state: all but the first (round 2), which holds one-off work."""

CASES: dict[str, list[str]] = {
    "fliu": ["+experiment=fliu_table1_paper"],
    "fedala": ["+experiment=fedala_table2_paper"],
    "flame": ["+experiment=flame_table3_paper"],
    "fedmpr": ["+experiment=fedmpr_table2_paper"],
    "diversifed": ["+experiment=diversifed_table2_paper"],
    "resnet18-cifar": [
        "+experiment=fedmpr_table2_paper",
        "dataset=synthetic",
        "dataset.image_shape=[3,32,32]",
        "dataset.num_train=50000",
        "dataset.num_test=10000",
        "split=default",
        "partition=iid",
    ],
    "fedala-cnn": ["+experiment=fedala_table2_paper", "strategy=fedavg"],
}

SCALING_CASES = ("flame", "fedala-cnn")

SMOKE = [
    "dataset=synthetic",
    "dataset.image_shape=[1,16,16]",
    "dataset.num_train=160",
    "dataset.num_test=40",
    "split=default",
    "partition=iid",
    "num_clients=2",
    "train.local_epochs=1",
    "eval.global_test_max_samples=20",
]
"""Overrides that shrink any case to seconds on a CPU (``--smoke``)."""

TRAINING_ROUNDS_ONLY = ["eval.every=1000"]
"""Evaluation only after the last round: the timed rounds are training rounds, as the floor's."""


class GpuSampler:
    """Samples the GPU's utilization (%) and used memory (MiB) every ``interval_s`` while
    active: through NVML's Python bindings when importable, else ``nvidia-smi``; nothing without
    either (``summary()`` is then empty). GPU 0 of the visible devices."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._read = self._reader()

    @staticmethod
    def _reader() -> Any:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
            handle = (
                pynvml.nvmlDeviceGetHandleByIndex(int(visible))
                if visible.isdigit()
                else pynvml.nvmlDeviceGetHandleByUUID(visible)
            )

            def nvml() -> tuple[float, float]:
                rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                return float(rates.gpu), memory.used / 2**20

            return nvml
        except Exception:  # no bindings, no driver: try the command line tool
            pass
        if shutil.which("nvidia-smi") is None:
            return None

        def smi() -> tuple[float, float]:
            out = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=utilization.gpu,memory.used",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout.splitlines()[0]
            utilization, used = (float(v) for v in out.split(","))
            return utilization, used

        return smi

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a failed sample is skipped
                self.samples.append(self._read())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GpuSampler:
        if self._read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self) -> dict[str, float]:
        """Mean and peak utilization, peak memory, over the samples (empty without any)."""
        if not self.samples:
            return {}
        utilization = [s[0] for s in self.samples]
        return {
            "gpu_util_mean_pct": statistics.fmean(utilization),
            "gpu_util_max_pct": max(utilization),
            "gpu_mem_max_mib": max(s[1] for s in self.samples),
            "gpu_samples": len(self.samples),
        }


def gpu_name() -> str:
    """The GPUs' names, from ``nvidia-smi``: this process never creates a CUDA context of its
    own, whose memory would count in every run's sampled peak."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        return ", ".join(
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split("\n")[:-1]
        )
    except (OSError, subprocess.CalledProcessError):
        return f"{torch.cuda.device_count()} CUDA device(s)"


def nvidia_smi() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def run_floor(workload: list[str], rounds: int, device_name: str) -> dict[str, Any]:
    """The floor (see the module docstring), in this process."""
    from pflower.compose import compose_config
    from pflower.core.experiment import Experiment
    from pflower.core.training import autocast, batch_indices, to_memory_format

    cfg = compose_config([*workload, f"rounds={rounds}"])
    if float(cfg.fraction) != 1.0:
        raise SystemExit(f"the floor trains every client each round; fraction={cfg.fraction}")
    torch.set_num_threads(int(cfg.train.threads))
    device = torch.device(device_name)
    started = time.time()
    experiment = Experiment(cfg)
    clients = [experiment.client_data(pid) for pid in range(cfg.num_clients)]
    model = experiment.new_model().to(device)
    global_state = {name: value.detach().clone() for name, value in model.state_dict().items()}
    criterion = torch.nn.CrossEntropyLoss()
    startup = time.time() - started
    round_times, images_per_round = [], []
    for server_round in range(1, rounds + 1):
        settings = experiment.train_settings(server_round)
        if settings.channels_last:
            model.to(memory_format=torch.channels_last)
        begin = time.perf_counter()
        sums: dict[str, torch.Tensor] = {}
        total, images = 0, 0
        for data in clients:
            model.load_state_dict(global_state)
            model.train()
            optimizer = settings.make_optimizer(model.parameters())
            seed = np.random.SeedSequence([cfg.seed, server_round, data.partition_id])
            generator = torch.Generator().manual_seed(int(seed.generate_state(1)[0]))
            split = data.train
            for index in batch_indices(
                len(split), settings.batch_size, generator, settings.epochs, settings.steps
            ):
                optimizer.zero_grad(set_to_none=True)
                inputs = data.prepare(split.images[index]).to(device, non_blocking=True)
                inputs = to_memory_format(inputs, settings.channels_last)
                labels = split.labels[index].to(device, non_blocking=True)
                with autocast(device, settings.amp):
                    loss = criterion(model(inputs), labels)
                loss.backward()
                optimizer.step()
                images += len(index)
            weight = len(split)
            total += weight
            for name, value in model.state_dict().items():
                if value.is_floating_point():
                    scaled = value.detach().double() * weight
                    sums[name] = scaled if name not in sums else sums[name] + scaled
                else:  # integer buffers (e.g. BatchNorm's counter): the last client's
                    sums[name] = value.detach().clone()
        global_state = {
            name: (sums[name] / total).to(value.dtype) if value.is_floating_point() else sums[name]
            for name, value in global_state.items()
        }
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        round_times.append(time.perf_counter() - begin)
        images_per_round.append(images)
    steady = statistics.median(round_times[STEADY_INTERVALS] or round_times)
    return {
        "round_times_s": round_times,
        "steady_round_s": steady,
        "images_per_round": images_per_round[-1],
        "images_per_s": images_per_round[-1] / steady,
        "startup_s": startup,
        "device": device_name,
    }


def floor_in_child(
    workload: list[str], rounds: int, device: str, time_limit_s: float | None
) -> dict[str, Any]:
    """:func:`run_floor` in a fresh interpreter (its own CUDA context and memory), sampled."""
    with GpuSampler() as sampler:
        started = time.time()
        try:
            output = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--mode",
                    "floor",
                    "--device",
                    device,
                    "--rounds",
                    str(rounds),
                    "--set",
                    *workload,
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=time_limit_s,
            ).stdout
        except subprocess.TimeoutExpired as stopped:
            return {"unfinished": f"stopped at {stopped.timeout:.0f} s"}
        except subprocess.CalledProcessError as failed:
            return {"failed": (failed.stderr or "")[-2000:]}
    result = json.loads(output.strip().splitlines()[-1])
    return {**result, "total_s": time.time() - started, **sampler.summary()}


def pflower_sampled(
    workload: list[str], rounds: int, run_dir: Path, time_limit_s: float | None
) -> dict[str, Any]:
    """The ``pflower`` command (``overhead.run_pflower``) with the GPU sampled meanwhile."""
    with GpuSampler() as sampler:
        try:
            measured = run_pflower(rounds, run_dir, workload, time_limit_s, STEADY_INTERVALS)
        except RunUnfinished as stopped:
            measured = {"unfinished": str(stopped), "rounds_done": stopped.rounds_done}
        except subprocess.CalledProcessError as failed:
            measured = {"failed": f"pflower exited with {failed.returncode}"}
    return {**measured, **sampler.summary()}


def utilization_cell(result: dict[str, Any]) -> str:
    if "gpu_util_mean_pct" not in result:
        return "- (no GPU sampled)"
    return (
        f"{result['gpu_util_mean_pct']:.0f} / {result['gpu_util_max_pct']:.0f} % "
        f"({result['gpu_mem_max_mib']:.0f} MiB)"
    )


def steady_cell(result: dict[str, Any]) -> str:
    if "steady_round_s" in result:
        return f"{result['steady_round_s']:.3f}"
    return result.get("unfinished") or "failed"


FLOOR_HEADER = (
    "| date | machine | case | device | pflower round (s) | floor round (s) | pflower / floor "
    "| images per round | pflower images/s | floor images/s "
    "| GPU util mean / max (peak memory): pflower | floor | command |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
)

SCALING_HEADER = (
    "| date | machine | case | device | concurrent clients (workers) | steady round (s) "
    "| rounds/s | speed-up over 1 | GPU util mean / max (peak memory) | command |\n"
    "|---|---|---|---|---|---|---|---|---|---|\n"
)


def workload_of(case: str, args: argparse.Namespace) -> list[str]:
    """The overrides of ``case``: the preset's, the smoke ones with ``--smoke`` (whose tiny
    synthetic dataset then replaces the ``dataset`` overrides of ``--set``), training rounds
    only, ``--set``."""
    extra = [o for o in args.set if not (args.smoke and o.startswith(("dataset=", "dataset.")))]
    return [*CASES[case], *(SMOKE if args.smoke else []), *TRAINING_ROUNDS_ONLY, *extra]


def compare_with_floor(
    case: str, args: argparse.Namespace, execution: list[str], tmp: Path, stamp: dict[str, str]
) -> dict[str, Any]:
    """Measurement 1 for ``case``: pflower, then the floor; one row of the floor table."""
    workload = workload_of(case, args)
    command = " ".join(["pflower", *workload, *execution, f"rounds={args.rounds}"])
    pflower = pflower_sampled([*workload, *execution], args.rounds, tmp / case, args.case_limit)
    floor = floor_in_child(workload, args.rounds, args.device, args.case_limit)
    result: dict[str, Any] = {
        **stamp,
        "measurement": "floor",
        "case": case,
        "device": args.device,
        "command": command,
        "pflower": pflower,
        "floor": floor,
    }
    cells = ["-", "-", "-", "-"]
    if "steady_round_s" in pflower and "steady_round_s" in floor:
        images = floor["images_per_round"]
        result["ratio_pflower_over_floor"] = pflower["steady_round_s"] / floor["steady_round_s"]
        result["pflower_images_per_s"] = images / pflower["steady_round_s"]
        cells = [
            f"{result['ratio_pflower_over_floor']:.2f}",
            str(images),
            f"{result['pflower_images_per_s']:.0f}",
            f"{floor['images_per_s']:.0f}",
        ]
    append_row(
        args.out / "gpu.md",
        FLOOR_HEADER,
        f"| {stamp['date']} | {stamp['machine']} | {case} | {args.device} "
        f"| {steady_cell(pflower)} | {steady_cell(floor)} | {' | '.join(cells)} "
        f"| {utilization_cell(pflower)} | {utilization_cell(floor)} | `{command}` |\n",
    )
    return result


def scaling(
    case: str, args: argparse.Namespace, execution: list[str], tmp: Path, stamp: dict[str, str]
) -> list[dict[str, Any]]:
    """Measurement 2 for ``case``: one pflower run per worker count; rows of the scaling table."""
    workload = workload_of(case, args)
    results: list[dict[str, Any]] = []
    one: float | None = None
    for workers in args.workers:
        run = [*workload, *execution, f"backend.workers={workers}"]
        command = " ".join(["pflower", *run, f"rounds={args.rounds}"])
        measured = pflower_sampled(run, args.rounds, tmp / f"{case}-w{workers}", args.case_limit)
        result: dict[str, Any] = {
            **stamp,
            "measurement": "scaling",
            "case": case,
            "device": args.device,
            "workers": workers,
            "command": command,
            **measured,
        }
        rate = speedup = "-"
        if "steady_round_s" in measured:
            result["rounds_per_s"] = 1.0 / measured["steady_round_s"]
            if workers == 1:
                one = result["rounds_per_s"]
            rate = f"{result['rounds_per_s']:.3f}"
            if one is not None:
                result["speedup_over_one"] = result["rounds_per_s"] / one
                speedup = f"{result['speedup_over_one']:.2f}"
        append_row(
            args.out / "gpu.md",
            SCALING_HEADER,
            f"| {stamp['date']} | {stamp['machine']} | {case} | {args.device} | {workers} "
            f"| {steady_cell(measured)} | {rate} | {speedup} | {utilization_cell(measured)} "
            f"| `{command}` |\n",
        )
        results.append(result)
        print(json.dumps(result, indent=2), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=[c for c in CASES if c != "fedala-cnn"])
    parser.add_argument("--no-floor", action="store_true", help="skip measurement 1")
    parser.add_argument("--scaling-cases", nargs="*", default=[], choices=list(CASES))
    parser.add_argument("--workers", nargs="*", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--backend", choices=["fork", "ray"], default="fork")
    parser.add_argument("--clients-per-gpu", type=int, default=4, help="Ray only")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny synthetic cases (seconds)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--mode", choices=["all", "floor"], default="all", help=argparse.SUPPRESS)
    parser.add_argument(
        "--case-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop a run still going after this long and record how far it got",
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra Hydra overrides"
    )
    args = parser.parse_args()
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device here; nothing was run", file=sys.stderr)
        raise SystemExit(2)
    if args.mode == "floor":  # the child of floor_in_child: --set carries the whole workload
        print(json.dumps(run_floor(args.set, args.rounds, args.device)))
        return
    execution = [
        f"backend={args.backend}",
        f"train.device={args.device}",
        "progress=false",
        "checkpoint.every=0",
    ]
    if args.device == "cuda" and args.backend == "ray":
        execution.append(f"backend.num_gpus_per_client={1 / args.clients_per_gpu}")
    stamp = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{machine_description()}, GPU: {gpu_name()}",
        "nvidia_smi": nvidia_smi(),
        "torch": torch.__version__,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    store = args.out / "gpu.json"

    def save() -> None:  # after every case: a run stopped by its lease keeps what it measured
        earlier = json.loads(store.read_text()) if store.exists() else []
        store.write_text(json.dumps([*earlier, *results], indent=2))
        results.clear()

    with tempfile.TemporaryDirectory() as tmp:
        for case in [] if args.no_floor else args.cases:
            results.append(compare_with_floor(case, args, execution, Path(tmp), stamp))
            print(json.dumps(results[-1], indent=2), flush=True)
            save()
        for case in args.scaling_cases:
            results.extend(scaling(case, args, execution, Path(tmp), stamp))
            save()


if __name__ == "__main__":
    main()
