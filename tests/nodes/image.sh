#!/usr/bin/env bash
# Builds the images the real nodes run, without a registry or a Docker engine, and exports
# them as OCI archives for the nodes' containerd to import:
#
#   debian:12-slim   the Dockerfile's base: a minimal Debian 12 root file system made with
#                    mmdebstrap (documentation and locales left out, as the slim image does)
#   pause:3.10       the pod sandbox: Kubernetes's own pause.c from the pinned release,
#                    linked statically
#   cirrus:latest    the project's Dockerfile, built unmodified with buildah
#
# Output: $IMAGES_HOME/{pause,cirrus}.oci.tar. Idempotent: the base and pause images are made
# once per cache; the Cirrus image again only when the build context (the files .dockerignore
# lets through) or the base image changed since the exported one was built: a rebuild took
# 80 s even with buildah's layer cache (its RUN make step), twice in every `make test`.
# Needs root and tests/nodes/install.sh's packages.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root "building images"
command -v buildah >/dev/null || ndie "buildah is not installed (run tests/nodes/install.sh)"
mkdir -p "$IMAGES_HOME" "$BUILDAH_ROOT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cirrus-image.XXXXXX")
# buildah leaves its storage mounted (the storage root bound on itself, a build's layers):
# nothing of it stays mounted once the images are exported, so the cache can be moved or
# deleted and the machine's mount table is as it was.
release_storage() {
    bah rm --all >/dev/null 2>&1 || true
    bah umount --all >/dev/null 2>&1 || true
    awk -v root="$BUILDAH_ROOT/" 'index($2 "/", root) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}
trap 'release_storage; rm -rf "$WORK"' EXIT

have_image() { bah inspect --type image "$1" >/dev/null 2>&1; }

# ---- the base image ------------------------------------------------------------------------
if have_image "$BASE_IMAGE"; then
    nlog "base image $BASE_IMAGE: present"
else
    t0=$SECONDS
    nlog "base image: bootstrapping Debian 12 (bookworm, minbase) with mmdebstrap"
    slim=()
    for p in /usr/share/man/'*' /usr/share/locale/'*' /usr/share/doc/'*' /usr/share/info/'*'; do
        slim+=(--dpkgopt="path-exclude=$p")
    done
    slim+=(--dpkgopt='path-include=/usr/share/locale/locale.alias' --dpkgopt='path-include=/usr/share/doc/*/copyright')
    mmdebstrap --quiet --variant=minbase "${slim[@]}" bookworm "$WORK/rootfs.tar"
    ctr=$(bah from scratch)
    bah add --quiet "$ctr" "$WORK/rootfs.tar" /
    bah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    bah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
    nlog "base image $BASE_IMAGE: made in $((SECONDS - t0))s"
fi

# ---- the pause image -----------------------------------------------------------------------
if [[ -s "$IMAGES_HOME/pause.oci.tar" ]]; then
    nlog "pause image: present"
else
    src=$(cd "$K8S_MOD_DIR" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
    [[ -f "$src" ]] || ndie "cannot find $src (run tests/cluster/install.sh first)"
    nlog "pause image: building $PAUSE_IMAGE from the pinned release's pause.c"
    gcc -Os -static -DVERSION="cirrus-$K8S_VERSION" -o "$WORK/pause" "$src"
    strip "$WORK/pause"
    ctr=$(bah from scratch)
    bah copy --quiet "$ctr" "$WORK/pause" /pause
    bah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
    bah commit --quiet --rm "$ctr" "$PAUSE_IMAGE" >/dev/null
    bah push --quiet "$PAUSE_IMAGE" "oci-archive:$WORK/pause.oci.tar:$PAUSE_IMAGE"
    mv "$WORK/pause.oci.tar" "$IMAGES_HOME/pause.oci.tar"
fi

# ---- the Cirrus image ----------------------------------------------------------------------
# The build context as `buildah bud` sends it: every file but those .dockerignore excludes
# (its patterns in order, the last match deciding, a `!` pattern taking a path back in).
context_files() {
    local -a pats=()
    local line f keep p
    while IFS= read -r line; do
        [[ -z "$line" || "$line" == '#'* ]] || pats+=("$line")
    done <"$REPO_DIR/.dockerignore"
    (cd "$REPO_DIR" && find . -type f -printf '%P\n') | LC_ALL=C sort | while IFS= read -r f; do
        keep=1
        for p in "${pats[@]}"; do
            if [[ "$p" == '!'* ]]; then
                # shellcheck disable=SC2053
                [[ "$f" == ${p#!} || "$f" == ${p#!}/* ]] && keep=1
            else
                # shellcheck disable=SC2053
                [[ "$f" == $p || "$f" == $p/* ]] && keep=0
            fi
        done
        [[ $keep == 1 ]] && printf '%s\n' "$f"
    done
}
sources_digest() {
    { bah inspect --type image --format '{{.FromImageID}}' "$BASE_IMAGE"
      context_files | (cd "$REPO_DIR" && tr '\n' '\0' | xargs -0 sha256sum); } | sha256sum | cut -c1-64
}
digest=$(sources_digest)
if [[ -s "$IMAGES_HOME/cirrus.oci.tar" && "$(cat "$IMAGES_HOME/cirrus.sources" 2>/dev/null)" == "$digest" ]]; then
    nlog "cirrus image: present (its sources and base image unchanged since it was built)"
    exit 0
fi
t0=$SECONDS
nlog "cirrus image: buildah bud $REPO_DIR/Dockerfile -> $CIRRUS_IMAGE"
# The RUN steps in a chroot: no OCI runtime (buildah's default, crun, refuses a host with
# cgroups v1 and v2 mounted side by side), the host's network (they install Debian packages),
# and buildah's CNI lock file in the cache rather than /etc/cni.
bah bud --quiet --pull=never --network host --layers \
    --isolation chroot --cni-config-dir "$NODES_HOME/buildah-cni" -t "$CIRRUS_IMAGE" -f "$REPO_DIR/Dockerfile" "$REPO_DIR" >/dev/null
bah push --quiet "$CIRRUS_IMAGE" "oci-archive:$WORK/cirrus.oci.tar:$CIRRUS_IMAGE"
mv "$WORK/cirrus.oci.tar" "$IMAGES_HOME/cirrus.oci.tar"
echo "$digest" >"$IMAGES_HOME/cirrus.sources"
# Layers of earlier builds that no tag names any more.
bah rmi --prune >/dev/null 2>&1 || true
nlog "cirrus image: built and exported in $((SECONDS - t0))s ($(du -h "$IMAGES_HOME/cirrus.oci.tar" | cut -f1))"
