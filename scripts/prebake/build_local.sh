#!/usr/bin/env bash
# Build scripts/prebake/Dockerfile without a Docker engine or an image registry (buildah, vfs storage,
# chroot isolation, a debootstrap base image): a tiny fixture served by a local Hub (127.0.0.1, which chroot
# isolation shares) is converted with --stream in the build, verified; built again with --no-cache (streamed
# again), and a third time from a Hugging Face cache with no network at all: the model layer's digest stays.
#   scripts/prebake/build_local.sh          (as root; needs: apt-get install -y buildah debootstrap)
# Environment: FIMOE_PREBAKE_CACHE (base rootfs, kept between runs), FIMOE_PREBAKE_WORK (fixture),
# DEBIAN_MIRROR (default: the one apt's sources name), TORCH_INDEX (default: the CPU index, if reachable).
# The base image is built once; to rebuild it: buildah --storage-driver vfs rmi localhost/fimoe-base:bookworm
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${FIMOE_PREBAKE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fimoe-prebake}
WORK=${FIMOE_PREBAKE_WORK:-${TMPDIR:-/tmp}/fimoe-prebake}
SUITE=bookworm                                  # its python3 is 3.11: torch's cp311 wheel fits
BASE=localhost/fimoe-base:$SUITE
IMAGE=localhost/fimoe-prebake-demo
MODEL=fimoe-fixtures/DeepSeek-V4-Tiny           # a repo id that exists only on the local Hub and in the cache
COMMIT=c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ff   # its commit on both (seed_hub_cache's default)
TORCH_VERSION=2.13.0+cpu
CPU_INDEX=https://download.pytorch.org/whl/cpu
B=(buildah --storage-driver vfs)                # vfs: no overlay mounts inside this container
export BUILDAH_ISOLATION=chroot                 # no user namespaces or runc here

die() { echo "error: $*" >&2; exit 1; }
# The Debian mirror apt already uses for SUITE: no other source is assumed reachable.
apt_mirror() {
    python3 - "$1" <<'EOF'
import glob, re, sys
suite = sys.argv[1]
for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in open(f).read().split("\n\n"):
        kv = dict(l.split(":", 1) for l in stanza.splitlines() if ":" in l and not l.startswith(("#", " ")))
        kv = {k.strip(): v.split() for k, v in kv.items()}
        if "deb" in kv.get("Types", []) and suite in kv.get("Suites", []) and kv.get("URIs"):
            sys.exit(print(kv["URIs"][0]))
for f in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    for line in open(f) if glob.glob(f) else []:
        m = re.match(r"\s*deb\s+(\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
        if m and m.group(3) == suite:
            sys.exit(print(m.group(2)))
EOF
}
step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

[ "$(id -u)" = 0 ] || die "running as uid $(id -u); expected root (debootstrap and buildah's chroot isolation need it); run it with sudo"
for tool in buildah debootstrap python3; do
    command -v "$tool" >/dev/null || die "$tool is not on PATH; expected buildah, debootstrap and python3; run: apt-get install -y buildah debootstrap"
done
# The fixture and the local Hub run on this host, with its python3.
PYTHONPATH=$REPO python3 -c "import fimoe_convert.testing" 2>/dev/null \
    || die "$(command -v python3) cannot import fimoe_convert.testing (it needs torch, numpy, safetensors, huggingface_hub); expected the project's dependencies in the python3 on PATH; put a venv that has them first: PATH=VENV/bin:\$PATH"
echo "buildah: $(buildah --version)"
echo "debootstrap: $(debootstrap --version)"

# ---------------------------------------------------------------------------- base image (cached)
step "base image $BASE"
if "${B[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
    echo "cached: $("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$BASE")"
else
    if [ ! -f "$CACHE/base/rootfs.tar" ]; then
        MIRROR=${DEBIAN_MIRROR:-$(apt_mirror "$SUITE")}
        [ -n "$MIRROR" ] || die "no 'deb' source for suite $SUITE in /etc/apt/sources.list{,.d/}; expected one naming a Debian mirror; set DEBIAN_MIRROR=http://deb.debian.org/debian"
        echo "debootstrap $SUITE from $MIRROR"
        rm -rf "$CACHE/rootfs.tmp" && mkdir -p "$CACHE/base"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            "$SUITE" "$CACHE/rootfs.tmp" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
            || die "debootstrap failed (last lines: $(tail -n 3 "$CACHE/debootstrap.log" | tr '\n' ' ')); expected a $SUITE rootfs; see $CACHE/debootstrap.log"
        tar -C "$CACHE/rootfs.tmp" -cf "$CACHE/base/rootfs.tar.tmp" . && mv "$CACHE/base/rootfs.tar.tmp" "$CACHE/base/rootfs.tar"
        rm -rf "$CACHE/rootfs.tmp"
    fi
    # The host's CA bundle goes into the base: behind a TLS-intercepting proxy, only it has the proxy CA.
    cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$CACHE/base/ca-certificates.crt" \
        || die "no CA bundle at ${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}; expected the one this host's pip trusts; set SSL_CERT_FILE"
    "${B[@]}" bud --layers -f "$REPO/scripts/prebake/base.Containerfile" -t "$BASE" "$CACHE/base"
fi

# ---------------------------------------------------------------------------- torch's CPU wheel
step "torch $TORCH_VERSION (CPU build)"
TORCH_INDEX=${TORCH_INDEX:-$CPU_INDEX}
if python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=10)" "$TORCH_INDEX" 2>/dev/null; then
    echo "$TORCH_INDEX is reachable: the build installs torch from it"
else
    # The index is not reachable here: pip's own config (find-links) has the CPU wheel on this disk.
    echo "$TORCH_INDEX is not reachable: torch's CPU wheel goes into scripts/prebake/wheels/, the rest from PyPI"
    ls "$REPO"/scripts/prebake/wheels/torch-"$TORCH_VERSION"-*.whl >/dev/null 2>&1 \
        || python3 -m pip download --no-deps -d "$REPO/scripts/prebake/wheels" "torch==$TORCH_VERSION" \
        || die "pip download torch==$TORCH_VERSION failed; expected the CPU wheel from $TORCH_INDEX or pip's find-links; put torch-$TORCH_VERSION-*.whl into scripts/prebake/wheels/"
    TORCH_INDEX=https://pypi.org/simple
fi
ls -l "$REPO"/scripts/prebake/wheels/*.whl 2>/dev/null || true

# ---------------------------------------------------------------------------- fixture: a HF cache
step "fixture: $MODEL on a local Hub and in a Hugging Face cache"
rm -rf "$WORK" && mkdir -p "$WORK"
PYTHONPATH=$REPO python3 - "$WORK" "$MODEL" "$COMMIT" <<'EOF'
import sys
from pathlib import Path
from fimoe_convert.testing import make_checkpoint, seed_hub_cache
work, model, commit = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print("snapshot:", seed_hub_cache(make_checkpoint(work / "ckpt", "tiny"), work / "hf-cache", model, commit))
EOF
# bench_stream.py's Hub, logging one line a request to hub.log: method, path, Range, body bytes sent.
PYTHONPATH=$REPO:$REPO/scripts/bench python3 - "$WORK/ckpt" "$MODEL" "$COMMIT" > "$WORK/hub.url" 2> "$WORK/hub.log" <<'EOF' &
import sys, threading
from pathlib import Path
from bench_stream import Hub
hub = Hub(Path(sys.argv[1]), 1e9, sys.argv[2], sys.argv[3])  # 1e9 bytes/s: no real cap
local, take, serve = threading.local(), hub.bucket.take, hub.serve
def counted_take(n):  # called for each body chunk, in the request's thread, before it is written
    local.n += n
    take(n)
def logged_serve(h, body):
    local.n = 0
    try:
        serve(h, body)
    finally:
        print(h.command, h.path, h.headers.get("Range", "-").replace(" ", ""), local.n, file=sys.stderr, flush=True)
hub.bucket.take, hub.serve = counted_take, logged_serve
print(hub.url, flush=True)
threading.Event().wait()
EOF
HUB_PID=$!
trap 'kill "$HUB_PID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$WORK/hub.url" ] && break; sleep 0.2; done
HUB=$(head -n 1 "$WORK/hub.url")
[ -n "$HUB" ] || die "the local Hub did not start (log: $(tail -n 3 "$WORK/hub.log" | tr '\n' ' ')); expected its URL in $WORK/hub.url"
echo "local Hub: $HUB serves $MODEL@$COMMIT"
SHARD_BYTES=$(cat "$WORK"/ckpt/*.safetensors | wc -c)
hub_served() {  # hub_served FROM_LINE: the requests hub.log got after line FROM_LINE, and their body bytes
    tail -n "+$(($1 + 1))" "$WORK/hub.log" | awk -v shards="$SHARD_BYTES" '$1 == "GET" || $1 == "HEAD" {n++; b += $NF}
        END {printf "local Hub served: %d requests, %d bytes of file bodies (the fixture'"'"'s shards: %d bytes)\n", n, b, shards}'
}

# ---------------------------------------------------------------------------- build three times
build() {  # build TAG [buildah options]: --layers (one layer per instruction), docker format (keeps HEALTHCHECK)
    local tag=$1; shift
    "${B[@]}" bud --layers --force-rm --format docker "$@" \
        -f "$REPO/scripts/prebake/Dockerfile" \
        --build-arg "PYTHON_IMAGE=$BASE" --build-arg "MODEL=$MODEL" --build-arg "REVISION=$COMMIT" \
        --build-arg "TORCH_INDEX=$TORCH_INDEX" --build-arg "TORCH_VERSION=$TORCH_VERSION" \
        --build-arg FLASHINFER= -t "$IMAGE:$tag" "$REPO"
}
# The time before each STEP and COMMIT line: where a build spends its minutes (vfs copies every layer).
stamp() { while IFS= read -r l; do case $l in *STEP\ *|*COMMIT*) echo "[$(date -u +%T)] $l" ;; *) echo "$l" ;; esac; done; }
# An image's layers, one a line: diff_id (what `docker inspect` lists under RootFS.Layers) and the
# instruction. The model layer is the last (tests/cli/test_prebake_dockerfile.py keeps it last).
layers() {
    "${B[@]}" inspect --type image "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)["Docker"]
hist = [h["created_by"] for h in d["history"] if not h.get("empty_layer")]
ids = d["rootfs"]["diff_ids"]
if len(hist) != len(ids):
    sys.exit(f"error: {sys.argv[1]}: {len(hist)} history entries with a layer, {len(ids)} layers; expected as many; see buildah inspect")
for i, h in zip(ids, hist):
    print(i, h.split("#(nop) ")[-1].split(" /bin/sh -c ")[-1][:60])' "$1"
}
step "build 1 ($MODEL streamed from the local Hub)"
h0=$(wc -l < "$WORK/hub.log"); t0=$SECONDS; build 1 --build-arg "HF_ENDPOINT=$HUB" 2>&1 | stamp; t1=$((SECONDS - t0))
hub_served "$h0"
step "build 2 (--no-cache: every step runs again, the streamed conversion included)"
h0=$(wc -l < "$WORK/hub.log"); t0=$SECONDS; build 2 --no-cache --build-arg "HF_ENDPOINT=$HUB" 2>&1 | stamp; t2=$((SECONDS - t0))
hub_served "$h0"
# buildah's chroot isolation ignores --network none; a new network namespace around buildah does not.
# The hf-cache context (and no HF_ENDPOINT) changes the conversion step only: it re-runs on build 2's layers.
step "build 3 (from the hf-cache context, no network at all: unshare -n; the conversion step re-runs)"
t0=$SECONDS
unshare -n true || die "unshare -n failed; expected a new network namespace (root with CAP_SYS_ADMIN); run as root outside a restricted container"
unshare -n bash -c "set -o pipefail; $(declare -p B REPO WORK BASE MODEL COMMIT TORCH_INDEX TORCH_VERSION IMAGE); $(declare -f build stamp); build 3 --build-context hf-cache=$WORK/hf-cache --build-arg CONVERT_ARGS=-q 2>&1 | stamp"
t3=$((SECONDS - t0))

# ---------------------------------------------------------------------------- run the image
step "run $IMAGE:2"
ctr=$("${B[@]}" from "$IMAGE:2")
trap '"${B[@]}" rm "$ctr" >/dev/null; kill "$HUB_PID" 2>/dev/null || true' EXIT
"${B[@]}" run "$ctr" -- fimoe-convert verify /models/out
health=$("${B[@]}" inspect --type image "$IMAGE:2" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Docker"]["config"]["Healthcheck"]["Test"][-1])')
echo "HEALTHCHECK CMD sh -c '$health'"
"${B[@]}" run "$ctr" -- sh -c "$health" && echo "health check command: exit 0" \
    || die "the image's HEALTHCHECK command failed; expected exit 0 on a verified /models/out; try it in: buildah run $ctr -- sh"
# The entrypoint (ENGINE=none here: no engine in the base image) says what the image holds.
"${B[@]}" run "$ctr" -- fimoe-serve || die "the image's entrypoint fimoe-serve failed; expected it to describe /models/out"
"${B[@]}" run "$ctr" -- sh -c 'cd /models/out && sha256sum $(find . -type f | sort) && ls -ld --time-style=+%s /models /models/out $(find . -type f | sort)'

# ---------------------------------------------------------------------------- digests
step "layer digests"
for t in 1 2 3; do layers "$IMAGE:$t" > "$WORK/layers.$t"; done
echo "build 1 vs build 2 (--no-cache), per layer:"
python3 -c '
import sys
one, two = (open(f).read().splitlines() for f in sys.argv[1:3])
for a, b in zip(one, two):
    (da, what), db = a.split(" ", 1), b.split()[0]
    print("  " + ("same   " if da == db else "differs"), da[:19], db[:19], what)
' "$WORK/layers.1" "$WORK/layers.2"
m1=$(tail -n 1 "$WORK/layers.1" | cut -d' ' -f1); m2=$(tail -n 1 "$WORK/layers.2" | cut -d' ' -f1); m3=$(tail -n 1 "$WORK/layers.3" | cut -d' ' -f1)
echo "model layer, build 1 (${t1}s, streamed):                   $m1"
echo "model layer, build 2 (${t2}s, streamed, --no-cache):       $m2"
echo "model layer, build 3 (${t3}s, from the cache, no network): $m3"
[ "$m1" = "$m2" ] && [ "$m2" = "$m3" ] \
    || die "the model layer differs between builds ($m1, $m2, $m3); expected one digest; compare the layers' files: buildah push -D IMAGE oci:DIR, then tar -tvf --full-time on the last layer's blob"
echo "model layer: same digest in all three builds"

# vfs keeps a full copy of the tree per layer: keep the last image, drop the others and the build cache.
"${B[@]}" rmi "$IMAGE:1" "$IMAGE:3" >/dev/null && "${B[@]}" tag "$IMAGE:2" "$IMAGE:latest"
"${B[@]}" rmi --prune >/dev/null || true
echo "kept: $IMAGE:2 ($IMAGE:latest), $BASE"
