#!/bin/sh
# The tooljail daemon's entrypoint in a Kubernetes pod: two mounts the process
# backend's sandboxes need that a container does not have by default, then
# `exec tooljail "$@"`, so that the daemon is PID 1 and gets the kubelet's
# SIGTERM (its drain) directly.
#
# 1. A read-write cgroup2 tree. Container runtimes mount /sys/fs/cgroup
#    read-only in unprivileged containers, even inside the container's own
#    cgroup namespace; the daemon limits each sandbox's memory, pids and CPU
#    with a cgroup of its own below the pod's (and the pod's limit bounds them
#    all). Needs SYS_ADMIN and AppArmor unconfined (see the securityContext).
# 2. An unmasked procfs at /run/tooljail/proc. The runtime masks paths of the
#    container's /proc (/proc/kcore, /proc/sys read-only, ...), and the kernel
#    then refuses bubblewrap a fresh /proc in its user namespace ("mount too
#    revealing"). A full procfs mounted anywhere in this mount namespace lifts
#    that; it is not bound into any sandbox (each gets its own /proc).
#
# Either mount failing is reported and the daemon starts anyway: with
# isolation = "strict" (tooljail.toml) it then refuses to start and names the
# missing feature, which is the message to act on.
set -eu

cgroup=/sys/fs/cgroup
if [ -f "$cgroup/cgroup.controllers" ] && ! [ -w "$cgroup/cgroup.procs" ]; then
    mount -o remount,rw "$cgroup" 2>/dev/null \
        || mount -o remount,bind,rw "$cgroup" 2>/dev/null \
        || echo "tooljail-entrypoint: cannot make $cgroup writable (needs SYS_ADMIN, AppArmor unconfined)" >&2
fi

proc=/run/tooljail/proc
mkdir -p "$proc"
if ! mountpoint -q "$proc"; then
    mount -t proc -o nosuid,nodev,noexec proc "$proc" \
        || echo "tooljail-entrypoint: cannot mount an unmasked procfs at $proc (needs SYS_ADMIN, AppArmor unconfined)" >&2
fi
chmod 0700 /run/tooljail

exec tooljail "$@"
