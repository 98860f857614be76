"""Is a path on a network filesystem? There inotify only sees writes made by this node.

On HPC clusters logs live on Lustre, GPFS or NFS and are written by compute nodes, while
`gradwatch tail` runs on a login node: the kernel there is never told about those writes, so
following must poll. The mount table (`/proc/self/mountinfo`, else `/proc/mounts`) gives each
mount point's filesystem type; a path belongs to the longest mount point that prefixes it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = ["Mount", "is_network_fs", "mount_of", "network_mount", "parse_mountinfo", "parse_mounts"]

#: Filesystem types (or type prefixes) whose writes from other machines raise no inotify events.
#: BeeGFS is not in the usual lists but is a cluster filesystem just like Lustre.
_NETWORK_EXACT = frozenset({"lustre", "gpfs", "cifs", "ceph", "beegfs"})
_NETWORK_PREFIXES = ("nfs", "smb", "fuse")
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


def is_network_fs(fstype: str) -> bool:
    return fstype in _NETWORK_EXACT or fstype.startswith(_NETWORK_PREFIXES)


def _unescape(field: str) -> str:
    """The kernel writes spaces, tabs, newlines and backslashes in mount points as octal escapes."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """`/proc/self/mountinfo`: the mount point is field 5, the type follows the ` - ` separator."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) > sep + 1:
            out.append(Mount(_unescape(fields[4]), fields[sep + 1]))
    return out


def parse_mounts(text: str) -> list[Mount]:
    """`/proc/mounts`: device, mount point, type, options."""
    return [Mount(_unescape(f[1]), f[2]) for f in (line.split() for line in text.splitlines()) if len(f) >= 3]


def mount_of(path: str, table: list[Mount]) -> Mount | None:
    """The mount that holds `path` (absolute, symlinks resolved): the longest matching mount point.

    A later entry for the same mount point wins, as it hides the earlier one.
    """
    best: Mount | None = None
    for m in table:
        point = m.point.rstrip("/") or "/"
        inside = point == "/" or path == point or path.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def _table() -> list[Mount]:
    for name, parse in (("/proc/self/mountinfo", parse_mountinfo), ("/proc/mounts", parse_mounts)):
        try:
            with open(name, encoding="utf-8", errors="replace") as fh:
                return parse(fh.read())
        except OSError:
            continue
    return []  # not Linux: nothing known, so no reason to poll


def network_mount(path: str) -> Mount | None:
    """The network filesystem that holds `path` (or its nearest existing parent), if any."""
    mount = mount_of(os.path.realpath(path), _table())
    return mount if mount is not None and is_network_fs(mount.fstype) else None
