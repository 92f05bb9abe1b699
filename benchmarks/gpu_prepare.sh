#!/usr/bin/env bash
# Prepare, on the development machine, what benchmarks/gpu_all.sh needs on a lent GPU machine
# (which reaches nothing outside itself): the wheels of benchmarks/gpu_wheels.txt for its
# Python 3.12, and the MNIST files, in .gpu/ at the repository's root (ignored by git through
# .git/info/exclude, carried by the device call: `carry: [".gpu"]`). Fashion-MNIST (30 MB) does
# not fit beside them in the 64 MiB that travel: DiversiFed's case runs on MNIST (same shapes).
# On 2026-11-28 this gave 35 wheels, 20 MB, and .gpu/ held 31 MB.
#
#   bash benchmarks/gpu_prepare.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
mkdir -p .gpu/wheels .gpu/data/mnist
cp "${PFLOWER_DATA:-/work/shared/data}"/mnist/*.gz .gpu/data/mnist/
platforms=(--platform manylinux2014_x86_64 --platform any)
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
for requirement in $(grep -v '^#' benchmarks/gpu_wheels.txt | grep .); do
    name=${requirement%%==*}
    if ls .gpu/wheels/ | grep -qi "^${name//-/_}-${requirement##*==}-"; then
        continue  # already here
    fi
    # a wheel for the machine's CPython 3.12; a package published only as source (pure Python:
    # antlr4-python3-runtime 4.9.3, Hydra's parser runtime; iterators) is built into one here
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d .gpu/wheels "$requirement" 2>/dev/null ||
        python3 -m pip wheel -q --no-deps -w .gpu/wheels "$requirement"
done
ls .gpu/wheels | wc -l
du -sh .gpu
