#!/usr/bin/env bash
# Builds the service images variant-proxy, variant-scheduler and variant-agent from Debian
# packages, without any container registry:
#   1. a Debian 12 rootfs by debootstrap (minbase, python3, python3-venv, ca-certificates),
#      kept in ROOTFS_CACHE when that is set, and reused from there;
#   2. the wheel and its dependencies installed into /opt/docker-variant inside it (chroot),
#      offline from a wheelhouse that this host downloads for the image's own Python;
#   3. `docker import` of that rootfs as PREFIX/runtime:VERSION, then one `docker build`
#      (classic builder, host network) per stage of deploy/images/Dockerfile.
# Needs root (debootstrap, chroot) and a Docker engine (DOCKER_HOST as the docker CLI takes it).
#
#   python -m build --wheel && sudo deploy/images/build.sh dist/docker_variant-*.whl
#
# Environment: PYTHON (with pip, to download wheels; default python3), IMAGE_PREFIX (default
# docker-variant/), ROOTFS_CACHE (a .tar path), DEBIAN_MIRROR (default deb.debian.org).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
wheel=$(realpath "${1:?usage: build.sh WHEEL}")
python=${PYTHON:-python3}
prefix=${IMAGE_PREFIX:-docker-variant/}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
name=$(basename "$wheel")
case "$name" in  # a pure-Python wheel, installed by the images' Python (Debian 12's 3.11)
    *-py3-none-any.whl) ;;
    *) echo "build.sh: $name is not a pure-Python wheel (py3-none-any)" >&2; exit 2 ;;
esac
version=${name#docker_variant-}
version=${version%%-*}
work=$(mktemp -d /tmp/docker-variant-images.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
in_rootfs() { chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
say() { echo "build.sh: $*" >&2; }

mkdir "$rootfs"
if [ -n "${ROOTFS_CACHE:-}" ] && [ -s "$ROOTFS_CACHE" ]; then
    say "rootfs from $ROOTFS_CACHE"
    tar --numeric-owner -xf "$ROOTFS_CACHE" -C "$rootfs"
else
    say "debootstrap bookworm from $mirror"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*
    if [ -n "${ROOTFS_CACHE:-}" ]; then
        tar --numeric-owner -cf "$ROOTFS_CACHE.part" -C "$rootfs" . && mv "$ROOTFS_CACHE.part" "$ROOTFS_CACHE"
    fi
fi

say "installing $name into /opt/docker-variant"
wheelhouse=$rootfs/tmp/wheelhouse
mkdir -p "$wheelhouse"
cp "$wheel" "$wheelhouse/"
# the image runs both servers and the node agent: the [server] extra
"$python" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$wheelhouse" "$wheel[server]"
in_rootfs python3 -m venv /opt/docker-variant
cp "$here/wheelhouse_gaps.py" "$rootfs/tmp/"
# the image's Python may need what the host's did not (environment markers): fetch it too
for _ in 1 2 3 4 5; do
    mapfile -t gaps < <(in_rootfs /opt/docker-variant/bin/python /tmp/wheelhouse_gaps.py /tmp/wheelhouse 'docker-variant[server]')
    ((${#gaps[@]})) || break
    say "also for the image's Python: ${gaps[*]}"
    "$python" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$wheelhouse" "${gaps[@]}"
done
in_rootfs /opt/docker-variant/bin/pip install -q --disable-pip-version-check --no-index \
    --find-links /tmp/wheelhouse 'docker-variant[server]'
rm -rf "$wheelhouse" "$rootfs/tmp/wheelhouse_gaps.py" "$rootfs/root/.cache" \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
mkdir -p "$rootfs/var/lib/docker-variant"
chown 65534:65534 "$rootfs/var/lib/docker-variant"

say "docker import ${prefix}runtime:$version"
# metadata set here costs no build step (on the vfs storage driver each step copies the rootfs)
tar --numeric-owner -cf - -C "$rootfs" . | docker import \
    --change "ENV PATH=/opt/docker-variant/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV LANG=C.UTF-8 PYTHONUNBUFFERED=1" \
    --change "WORKDIR /var/lib/docker-variant" \
    --change "USER 65534:65534" \
    --change "LABEL org.opencontainers.image.version=$version org.opencontainers.image.licenses=Apache-2.0" \
    - "${prefix}runtime:$version" >/dev/null
for target in variant-proxy variant-scheduler variant-agent; do
    say "docker build ${prefix}$target:$version"
    DOCKER_BUILDKIT=0 docker build -q --network=host --build-arg "BASE=${prefix}runtime:$version" \
        --target "$target" -t "${prefix}$target:$version" "$here" >/dev/null
done
echo "${prefix}variant-proxy:$version ${prefix}variant-scheduler:$version ${prefix}variant-agent:$version"
