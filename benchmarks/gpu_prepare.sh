#!/usr/bin/env bash
# Prepare, on the development machine, what benchmarks/gpu_all.sh needs on a lent GPU machine
# (which reaches nothing outside itself): the wheels of benchmarks/gpu_wheels.txt for its
# Python 3.12, and the MNIST files, in .gpu/ at the repository's root (ignored by git through
# .git/info/exclude, carried by the device call: `carry: [".gpu"]`). Fashion-MNIST (30 MB) does
# not fit beside them in the 64 MiB that travel: DiversiFed's case runs on MNIST (same shapes).
#
#   bash benchmarks/gpu_prepare.sh            # then: du -sh .gpu (must stay under ~60 MB)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
mkdir -p .gpu/wheels .gpu/data/mnist
cp "${PFLOWER_DATA:-/work/shared/data}"/mnist/*.gz .gpu/data/mnist/
grep -v '^#' benchmarks/gpu_wheels.txt | grep . > .gpu/requirements.txt
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform any \
    -d .gpu/wheels -r .gpu/requirements.txt
du -sh .gpu
