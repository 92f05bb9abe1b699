#!/usr/bin/env bash
# Every GPU measurement of issue 39 in one device call, bounded in time (default 560 s in all).
#
# Before the call, on the development machine: `bash benchmarks/gpu_prepare.sh` (wheels and
# MNIST into .gpu/). The call (one, on an nvidia-h100-x1 or nvidia-h200):
#
#   run(command="bash benchmarks/gpu_all.sh", carry=[".gpu"], timeout_s=600)
#
# Results land in $OUT (gpu.json, gpu.md, gpu_all.log, nvidia-smi.txt); copy them into
# benchmarks/results/ (gpu.json appended, gpu.md's new rows under a dated heading) with the
# machine's name. Steps run in priority order (the issue's done-when first: every floor, then
# the scaling table; the speed options last); each gets at most its own limit and what is left
# of BUDGET_S, and a step that no longer fits is skipped and logged as such, so that a second
# call, made while the machine is still warm, can run the rest: `bash benchmarks/gpu_all.sh
# options`. Expected on an H100/H200, estimated from the 2026-11-26/27 H200 rounds (pflower's
# first round with start-up 20-31 s, steady rounds 0.9-15 s; not yet seen as a whole):
# environment 20-30 s, floor-resnet ~65 s, floor-mlp-cnn ~95 s, floor-small ~110 s,
# scaling-flame ~75 s, scaling-fedala ~130 s, options ~95 s: about 600 s, so the options may
# need that second call (about 100 s). A device session has 15 minutes in all, the machine's
# start (1-2 min) included: one call of at most 600 s and a short second one fit; two long
# ones do not. Rounds are 3 for the costly cases (the steady round is then round 3 alone) and 4
# for the cheap ones. The ResNet-18 cases train on 20,000 CIFAR-shaped images (10,000 per
# client), not 50,000: images/s and the ratio do not depend on the count once a round lasts
# seconds, and a round costs about 6 s instead of 15 on the H200.
#
# GPU_ARGS="--device cpu --smoke" runs the same steps on a CPU, tiny (a check of the script).
#
# Steps (what benchmarks/gpu.py measures: see its docstring):
#   floor-resnet   pflower vs the bare loop: FedMPR's ResNet-18 on CIFAR-shaped data, 1 epoch
#   floor-mlp-cnn  the same for FLAME's MLP and FedALA's CNN presets
#   floor-small    the same for FLIU's and DiversiFed's presets (on MNIST)
#   scaling-flame  rounds/s with 1, 5, 10 concurrent clients (forked workers on the one GPU;
#                  the preset has 10 clients)
#   scaling-fedala the same with 1, 5, 20 for FedALA's CNN (20 clients; FedAvg, so that round 2
#                  has no ALA start phase)
#   options        train.amp=bf16 + channels_last on ResNet-18 (off: floor-resnet's row), and
#                  train.data_on_device on FLAME's MLP (off: floor-mlp-cnn's flame row), each
#                  beside its own floor with the same settings
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
budget=${BUDGET_S:-560}
out=${OUT:-/tmp/gpu_all}
mkdir -p "$out"
log="$out/gpu_all.log"
exec > >(tee -a "$log") 2>&1
export PYTHONUNBUFFERED=1 PFLOWER_DATA=${PFLOWER_DATA:-$PWD/.gpu/data}
python=${PYTHON:-python3}

if PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} $python -c "import flwr, hydra" 2>/dev/null; then
    [ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # a warm machine
else
    if ls .gpu/wheels/*.whl >/dev/null 2>&1; then
        $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .gpu/wheels/*.whl || exit 3
        export PYTHONPATH=/tmp/site
    else
        echo "gpu_all.sh: flwr/hydra missing and no .gpu/wheels: run benchmarks/gpu_prepare.sh here first and carry .gpu"
        exit 3
    fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$python -c "import pflower.cli, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 3
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
echo "gpu_all.sh: environment ready after $((SECONDS - started)) s"

step() {  # step NAME LIMIT_S ARGS...: run benchmarks/gpu.py within min(LIMIT_S, time left)
    local name=$1 limit=$2
    shift 2
    local left=$((budget - (SECONDS - started)))
    if [ "$left" -lt 45 ]; then
        echo "gpu_all.sh: SKIPPED $name: ${left} s left of ${budget} s"
        return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    echo "gpu_all.sh: step $name (limit ${limit} s) at $((SECONDS - started)) s"
    timeout --signal=INT --kill-after=10 "$limit" \
        "$python" benchmarks/gpu.py ${GPU_ARGS:---device cuda} --out "$out" "$@"
    echo "gpu_all.sh: step $name ended with $? at $((SECONDS - started)) s"
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(floor-resnet floor-mlp-cnn floor-small scaling-flame scaling-fedala options)
resnet=(train.local_epochs=1 dataset.num_train=20000 dataset.num_test=4000)
for name in "${steps[@]}"; do
    case $name in
        floor-resnet) step "$name" 135 --rounds 3 --cases resnet18-cifar --case-limit 60 \
            --set "${resnet[@]}" ;;
        floor-mlp-cnn) step "$name" 160 --rounds 3 --cases flame fedala --case-limit 60 ;;
        floor-small) step "$name" 130 --rounds 4 --cases fliu diversifed --case-limit 45 \
            --set dataset=mnist ;;
        scaling-flame) step "$name" 110 --rounds 4 --no-floor --scaling-cases flame \
            --workers 1 5 10 --case-limit 40 ;;
        scaling-fedala) step "$name" 150 --rounds 3 --no-floor --scaling-cases fedala-cnn \
            --workers 1 5 20 --case-limit 75 ;;
        options)
            step "$name-amp" 110 --rounds 3 --cases resnet18-cifar --case-limit 50 \
                --set "${resnet[@]}" train.amp=bf16 train.channels_last=true
            step "$name-resident" 85 --rounds 3 --cases flame --case-limit 35 \
                --set train.data_on_device=true ;;
        *) echo "gpu_all.sh: unknown step $name" ;;
    esac
done
echo "gpu_all.sh: done after $((SECONDS - started)) s"
