#!/usr/bin/env bash
# Run docker/ with Debian's podman (no Docker engine, no container registry): podman's
# configuration, a local python:3.11-slim base image, and the pflower image. tests/test_containers.py
# calls it; it works by hand too (docker/README.md, "Podman without a registry").
#
#   config  write containers.conf to $PFLOWER_PODMAN_DIR: runtime runc (crun fails on mixed
#           cgroups), cgroup manager cgroupfs, events logger file, and default ulimits equal to
#           this shell's hard limits (podman's defaults are refused in some sandboxes)
#   base    if no python:3.11-slim image is there: a `debootstrap --variant=minbase bookworm`
#           root file system (Debian bookworm's python3 is 3.11) with a virtualenv at /opt/venv
#           first on PATH (Debian's pip refuses system installs), imported as
#           docker.io/library/python:3.11-slim, so docker/Dockerfile's FROM finds it unchanged
#   image   build docker/Dockerfile (VARIANT=cuda: PyPI's torch; the CPU variant's torch index
#           is download.pytorch.org), with this machine's pip configuration and
#           the local folders it names as read-only build volumes and the host's network, tagged
#           pflower:cpu (what compose.yml runs; its torch runs on the CPU when there is no GPU).
#           The image carries the label pflower.inputs, a hash of everything the build reads;
#           when it matches, the build is skipped (and podman's layer cache keeps the torch layer
#           when only pflower changed).
#   all     config, base and image (the default)
#   env     print the environment that the podman and podman-compose commands need
#
# Usage: docker/podman/setup.sh [config|base|image|all|env]
# Then:  eval "$(docker/podman/setup.sh env)"; podman-compose -f docker/compose.yml ... (README)
#
# Environment: PFLOWER_PODMAN_DIR (default ~/.local/state/pflower/podman), PFLOWER_DEBIAN_MIRROR (default: this machine's first Debian source, else
# http://deb.debian.org/debian), PFLOWER_IMAGE (default pflower:cuda).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
state="${PFLOWER_PODMAN_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/pflower/podman}"
image="${PFLOWER_IMAGE:-pflower:cpu}"
base_image="docker.io/library/python:3.11-slim"
base_recipe="debootstrap-minbase-bookworm-python3-venv-v1"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
log() { echo "setup.sh: $*" >&2; }
need() { command -v "$1" >/dev/null || { log "needs $1 ($2)"; exit 1; }; }

export CONTAINERS_CONF="$state/containers.conf"

write_config() {
  need podman "apt-get install podman"
  need runc "apt-get install runc"
  mkdir -p "$state"
  local nofile nproc
  nofile="$(ulimit -Hn)"
  nproc="$(ulimit -Hu)"
  [[ "$nofile" == unlimited ]] && nofile=1048576
  [[ "$nproc" == unlimited ]] && nproc=4194304
  # podman starts conmon (runc's parent) with nproc at most kernel.pid_max; without
  # CAP_SYS_RESOURCE (sandboxes) the container cannot raise it back, so ask for no more.
  local pid_max
  pid_max="$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")"
  ((nproc > pid_max)) && nproc="$pid_max"
  cat >"$CONTAINERS_CONF.tmp" <<EOF
# Written by docker/podman/setup.sh; used through CONTAINERS_CONF=$CONTAINERS_CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
  podman info >/dev/null || { log "podman info fails with $CONTAINERS_CONF"; exit 1; }
  log "podman configured ($CONTAINERS_CONF)"
}

debian_mirror() {
  if [[ -n "${PFLOWER_DEBIAN_MIRROR:-}" ]]; then
    echo "$PFLOWER_DEBIAN_MIRROR"
    return
  fi
  local uri
  uri="$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' \
    | grep -v security | head -n1 || true)"
  [[ -z "$uri" ]] && uri="$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' \
    | grep -v security | head -n1 || true)"
  echo "${uri:-http://deb.debian.org/debian}"
}

build_base() {
  if podman image exists "$base_image"; then
    log "base image $base_image is there ($(podman image inspect --format \
      '{{index .Labels "pflower.base"}}' "$base_image" || true))"
    return
  fi
  need debootstrap "apt-get install debootstrap"
  [[ "$(id -u)" == 0 ]] || { log "debootstrap needs root"; exit 1; }
  local root mirror
  root="$(mktemp -d "$state/rootfs.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$root'" RETURN
  mirror="$(debian_mirror)"
  log "debootstrap bookworm from $mirror into $root"
  nice -n 10 debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror" >"$state/debootstrap.log" 2>&1 \
    || { tail -n 30 "$state/debootstrap.log" >&2; exit 1; }
  chroot "$root" /usr/bin/python3 -m venv /opt/venv
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
  tar -C "$root" --numeric-owner -cf - . | podman import \
    --change "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV LANG=C.UTF-8" \
    --change 'CMD ["python3"]' \
    --change "LABEL pflower.base=$base_recipe" \
    - "$base_image" >/dev/null
  log "imported $base_image ($(podman run --rm "$base_image" python --version))"
}

# The build's pip configuration: find-links, index URLs, certificate and constraints of this
# machine's pip (`pip config list`), and the local folders they name, mounted read-only.
# Writes $state/build/pip.conf and constraints.txt; prints one `-v` argument per line.
pip_build_config() {
  local build="$state/build"
  mkdir -p "$build"
  python3 - "$build" <<'EOF'
import os, subprocess, sys
from pathlib import Path
from urllib.parse import urlparse

build = Path(sys.argv[1])
listing = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
).stdout
values: dict[str, list[str]] = {}
for line in listing.splitlines():
    key, _, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    for item in value.strip().strip("'\"").split():
        if item not in values.setdefault(name, []):
            values[name].append(item)

mounts: set[str] = set()
def local(location: str) -> str | None:
    """The folder of a local find-links/index location (None for a remote URL)."""
    path = urlparse(location).path if location.startswith("file:") else location
    if "://" in path or not os.path.isabs(path):
        return None
    folder = Path(path)
    # an index's links point next to it (e.g. <root>/simple -> <root>/files): mount the root
    mounts.add(str(folder.parent if folder.name == "simple" else folder))
    return str(folder)

config = ["[global]"]
find_links = [f for f in values.get("find-links", []) if local(f) or "://" in f]
extra = [u for u in values.get("extra-index-url", []) if local(u) or "://" in u]
if find_links:
    config.append("find-links = " + " ".join(find_links))
if extra:
    config.append("extra-index-url = " + " ".join(extra))
if values.get("index-url"):
    local(values["index-url"][0])
    config.append("index-url = " + values["index-url"][0])
if values.get("cert"):
    mounts.add(values["cert"][0])
    config.append("cert = " + values["cert"][0])
constraints = []
for file in values.get("constraint", []):
    constraints += Path(file).read_text().splitlines()
(build / "constraints.txt").write_text("\n".join(constraints) + "\n")
config.append("constraint = /etc/pflower-build/constraints.txt")
(build / "pip.conf").write_text("\n".join(config) + "\n")
for folder in sorted(mounts):
    if os.path.exists(folder):
        print(f"{folder}:{folder}:ro")
print(f"{build}:/etc/pflower-build:ro")
print(f"{build}/pip.conf:/etc/pip.conf:ro")
EOF
}

# Hash of everything the image build reads: the Dockerfile and what it copies (its
# .dockerignore keeps pyproject.toml, README.md, conf/, pflower/), the base image, the build's
# pip configuration.
inputs_hash() {
  (
    cd "$repo"
    find docker/Dockerfile docker/Dockerfile.dockerignore pyproject.toml README.md conf pflower \
      -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
    podman image inspect --format '{{.Id}}' "$base_image"
    cat "$state/build/pip.conf" "$state/build/constraints.txt"
    echo "$image"
  ) | sha256sum | cut -c1-32
}

build_image() {
  local volumes=() line hash current
  while IFS= read -r line; do volumes+=(-v "$line"); done < <(pip_build_config)
  hash="$(inputs_hash)"
  current="$(podman image inspect --format '{{index .Labels "pflower.inputs"}}' "$image" \
    2>/dev/null || true)"
  if [[ "$current" == "$hash" ]]; then
    log "$image is up to date (pflower.inputs=$hash)"
    return
  fi
  log "building $image (pflower.inputs=$hash)"
  (
    cd "$repo"
    nice -n 10 podman build -f docker/Dockerfile --build-arg VARIANT=cuda --pull=never \
      --network host "${volumes[@]}" --label "pflower.inputs=$hash" -t "$image" .
  )
  podman image prune -f >/dev/null || true
}

case "${1:-all}" in
  config) write_config ;;
  base) build_base ;;
  image) build_image ;;
  all) write_config; build_base; build_image ;;
  env) echo "export CONTAINERS_CONF=$CONTAINERS_CONF" ;;
  -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac
