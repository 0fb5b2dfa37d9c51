"""Per-sandbox cgroups: find and kill every process a tool started, and bound them.

A process cannot leave its cgroup without write access to the cgroup tree, so a
sandbox's cgroup holds every descendant, however it forked, setsid'd or
daemonized. The same cgroup bounds the whole tree at once: memory, number of
processes and CPU time are limits on the sandbox, not on each process (an rlimit
is per process, so a tool could fork its way around it).

This works where the daemon may create cgroups: as root, or under systemd with
`Delegate=yes`.

- cgroup v2 (a unified tree at the root): sandboxes live in the daemon's own
  subtree, `<own>/<name>/<sandbox id>`. Controllers can only be enabled for
  children of a cgroup that holds no processes itself ("no internal processes"),
  so when the daemon's cgroup still holds processes, they (the daemon) are moved
  into a leaf `<own>/daemon` first. When any step of that fails the tracker
  still tracks and kills, without limits (`controllers` is then empty), and says
  why in a WARNING.
- cgroup v1 and hybrid hosts: one directory per hierarchy,
  `<mount>/<own path in that hierarchy>/<name>/<sandbox id>`: `pids` (required,
  it tracks), and `memory`, `cpu` and `freezer` where they are mounted and
  writable.

A sandbox joins its cgroup through file descriptors the daemon opened: see
`SandboxCgroup.open_procs`. Every method here blocks on the cgroup filesystem
(and `kill_and_remove` polls): the daemon calls them from a thread, never from
the event loop.

Where things are, in the order a sandbox meets them (v1 and v2 are not split
into modules: every operation has both, and they differ only in file names, so
each keeps its two spellings side by side):

- `_detect`: finding and preparing the tree at start-up (v2 or v1), `cgroup_name_for`;
- `_limits`: `CgroupLimits` and how each limit is written;
- `_tracker`: `CgroupTracker`, one cgroup per sandbox: made, limited, reused, swept;
- `_sandbox`: `SandboxCgroup`, one sandbox's cgroups: joined, killed, frozen, OOM;
- `_fs`: the layout (roles, names) and the single-call reads and writes all of them use.
"""

from tooljaild.sandbox.cgroups._detect import CGROUP_ROOT, PROC_SELF_CGROUP, cgroup_name_for
from tooljaild.sandbox.cgroups._fs import LIMIT_CONTROLLERS
from tooljaild.sandbox.cgroups._limits import CgroupLimits
from tooljaild.sandbox.cgroups._sandbox import SandboxCgroup
from tooljaild.sandbox.cgroups._tracker import CgroupTracker

__all__ = [
    "CGROUP_ROOT",
    "LIMIT_CONTROLLERS",
    "PROC_SELF_CGROUP",
    "CgroupLimits",
    "CgroupTracker",
    "SandboxCgroup",
    "cgroup_name_for",
]
