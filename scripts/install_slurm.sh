#!/usr/bin/env bash
# Install Slurm (slurmctld, slurmd, client commands) and MUNGE from the distribution, quietly.
#
# Idempotent: does nothing when slurmctld, slurmd, srun and munged are already installed.
# Needs root (or passwordless sudo) and apt (Debian/Ubuntu; Debian 12 ships Slurm 22.05).
# Starts no daemon: the Slurm tests and `chainermn.slurm` start their own, with their own
# configuration, inside namespaces (see docs/cluster.md, section "Slurm").
set -euo pipefail

need=()
for cmd in slurmctld slurmd srun sinfo munged; do
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need+=("$cmd")
done
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo -n "$0" "$@"
    fi
    echo "install_slurm.sh: missing ${need[*]}; run as root to install slurmctld, slurmd," \
         "slurm-client and munge with apt" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_slurm.sh: missing ${need[*]} and no apt-get here; install Slurm (slurmctld," \
         "slurmd, srun) and MUNGE with your package manager" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the packages' postinst from starting system-wide daemons where a service
# manager exists; the tests run their own.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
fi

log=$(mktemp)
trap '[ "$made_policy" = 1 ] && rm -f "$policy"; rm -f "$log"' EXIT
run() { "$@" >"$log" 2>&1 || { cat "$log" >&2; echo "install_slurm.sh: failed: $*" >&2; exit 1; }; }
run apt-get update -qq
# slurmd + slurmctld + slurm-client are what slurm-wlm pulls in, without its 30-odd optional
# plugin packages (hdf5, influxdb, ...); mpi/pmi2 and mpi/pmix come with slurm-wlm-basic-plugins.
run apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge

for cmd in slurmctld slurmd srun munged; do
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || {
        echo "install_slurm.sh: $cmd still missing after apt-get install" >&2; exit 1; }
done
