#!/usr/bin/env bash
# Run the whole test suite on Python 3.14 (Debian testing's python3.14) with the newest NumPy 2
# and setuptools, in a chroot; extra arguments go to pytest.
# Usage: sudo bash scripts/py314.sh [pytest args...]
#
# The chroot is built once with debootstrap (Debian testing, "forky") from the Debian mirror
# apt uses here (read from /etc/apt/sources.list*; MIRROR=... overrides) and cached in
# $CHAINERMN_PY314_ROOT (default /var/cache/chainermn-py314); a complete one is reused.  Each run
# binds /proc, /sys, /dev, /dev/shm, the repository (at the same path) and the cluster registry
# (/run/chainermn-cluster, shared with the host so namespace clusters never collide) into it,
# copies the host's CA bundle and pip configuration in, and runs
# `PYTHON=python3.14 bash scripts/test.sh --py314` (venv .venv-py314).  Every mount is undone on
# exit, failures and signals included.  Needs root (debootstrap, chroot, mounts) and apt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chroot_dir="${CHAINERMN_PY314_ROOT:-/var/cache/chainermn-py314}"
suite=forky
complete="$chroot_dir/.chainermn-py314-complete"
# What the suite needs in the chroot: Python, venv, the namespace cluster's tools, Slurm + MUNGE
# for tests/slurm, ssh for MPICH's Hydra launcher across namespace nodes.
packages=(python3.14 python3.14-venv ca-certificates iproute2 util-linux procps hostname
          openssh-client openssh-server slurmctld slurmd slurm-client munge)

if [ "$(id -u)" -ne 0 ]; then
    echo "py314.sh: needs root (debootstrap, chroot and bind mounts)" >&2
    exit 1
fi

mirror() {
    # The first Debian archive URI apt is configured with (not the security archive).
    if [ -n "${MIRROR:-}" ]; then echo "$MIRROR"; return; fi
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' "$f" | grep -v -- '-security' \
              | grep '/debian/\?$' | head -n1 || true)
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
          | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' \
          | grep -v -- '-security' | grep '/debian/\?$' | head -n1 || true)
    [ -n "$uri" ] || { echo "py314.sh: no Debian mirror in /etc/apt/sources.list*; set MIRROR=URL" >&2; exit 1; }
    echo "$uri"
}

mounted=()
unmount_all() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" 2>/dev/null || \
            echo "py314.sh: could not unmount ${mounted[$i]}" >&2
    done
    mounted=()
}
trap unmount_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
bind() {    # bind SRC [ro]: bind SRC at the same path inside the chroot
    local src="$1" dst="$chroot_dir$1"
    if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; touch "$dst"; fi
    mount --bind "$src" "$dst"
    mounted+=("$dst")
    if [ "${2:-}" = ro ]; then mount -o remount,bind,ro "$dst"; fi
}
bind_system() {
    # The chroot's / must be a mount point: `unshare --mount` (the namespace cluster) changes its
    # propagation, which fails with EINVAL on a plain directory.
    mount --bind "$chroot_dir" "$chroot_dir"
    mounted+=("$chroot_dir")
    bind /proc; bind /sys; bind /dev; bind /dev/shm
    [ -d /dev/pts ] && bind /dev/pts
}

in_chroot() {
    chroot "$chroot_dir" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}

build() {
    local m
    m=$(mirror)
    echo "py314.sh: building the Debian $suite chroot in $chroot_dir from $m (once)"
    [ -e /usr/share/debootstrap/scripts/$suite ] || ln -s sid /usr/share/debootstrap/scripts/$suite
    if [ ! -f "$chroot_dir/.chainermn-debootstrap-done" ]; then
        rm -rf "$chroot_dir"
        mkdir -p "$chroot_dir"
        debootstrap --variant=minbase "$suite" "$chroot_dir" "$m"
        touch "$chroot_dir/.chainermn-debootstrap-done"
    fi
    # A mirror may serve a frozen snapshot whose Release file has expired; keep the host's proxy.
    {
        echo 'Acquire::Check-Valid-Until "false";'
        echo 'Acquire::Check-Date "false";'
        apt-config dump 2>/dev/null | grep -iE '^Acquire::(http|https|ftp)::Proxy ' || true
    } > "$chroot_dir/etc/apt/apt.conf.d/99chainermn-py314"
    # Start no daemon from a package's postinst: the tests start their own.
    printf '#!/bin/sh\nexit 101\n' > "$chroot_dir/usr/sbin/policy-rc.d"
    chmod +x "$chroot_dir/usr/sbin/policy-rc.d"
    bind_system
    in_chroot apt-get update -qq
    in_chroot apt-get install -y -qq --no-install-recommends "${packages[@]}"
    in_chroot apt-get clean
    unmount_all
    touch "$complete"
}

if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
fi
[ -f "$complete" ] || build

# Host configuration pip needs: the CA bundle, pip.conf files, PIP_* variables and the local
# directories they name (file:// indexes, find-links: bound read-only) and files (constraints: copied).
install -D -m 644 /etc/ssl/certs/ca-certificates.crt "$chroot_dir/etc/ssl/certs/ca-certificates.crt"
cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf" 2>/dev/null || true
# The host's name must resolve inside too (MPICH's Hydra proxies connect back to it by name).
cp /etc/hosts "$chroot_dir/etc/hosts" 2>/dev/null || true
pipenv=()
while IFS= read -r line; do pipenv+=("$line"); done < <(env | grep '^PIP_' || true)
local_dirs=()
paths_in() { grep -oE '(file://)?/[^ ]+' | sed 's#^file://##' || true; }   # absolute paths in stdin
for conf in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
    [ -f "$conf" ] || continue
    install -D -m 644 "$conf" "$chroot_dir/${conf/#$HOME//root}"
    local_dirs+=($(paths_in < "$conf"))
done
for v in "${pipenv[@]}"; do
    local_dirs+=($(echo "${v#*=}" | paths_in))
done

bind_system
bind "$root"
# The cluster registry (root's, mode 0700: the cluster tool refuses any other), shared with the host.
[ -e /run/chainermn-cluster ] || mkdir -m 700 /run/chainermn-cluster
bind /run/chainermn-cluster
for d in "${local_dirs[@]}"; do
    d="${d%/simple}"; d="${d%/}"
    case "$d" in /etc/ssl/*|"$root"*) continue ;; esac
    if [ -d "$d" ]; then
        mountpoint -q "$chroot_dir$d" || bind "$d" ro
    elif [ -f "$d" ]; then
        # A file a pip setting names (e.g. `constraint = /etc/xdg/pip/constraints.txt`): copy it.
        install -D -m 644 "$d" "$chroot_dir$d"
    fi
done

status=0
# The venv's bin comes first on PATH, as in an activated venv: commands the tests hand to mpiexec
# (`python ...` on namespace nodes) are the venv's; the chroot has no `python` of its own.
in_chroot "${pipenv[@]}" PYTHON=python3.14 PATH="$root/.venv-py314/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" bash -c 'cd "$1" && shift && bash scripts/test.sh --py314 "$@"' \
    _ "$root" "$@" || status=$?
exit $status
