"""What a reliability check reads of a running gateway: its process (RSS, open files) and its accounting.

The process is read from ``/proc`` (Linux), the gateway's own accounting from ``/readyz``
(sessions, engine sessions) and ``/metrics`` (``duplex_gateway_tasks``: asyncio tasks alive).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

__all__ = ["cpu_s", "fds", "metric", "peak_rss_kib", "readyz", "reset_peak_rss", "rss_kib"]


def _status_kib(pid: int, field: str) -> int:
    """A ``kB`` line of ``/proc/<pid>/status``."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` in KiB."""
    return _status_kib(pid, "VmRSS")


def reset_peak_rss(pid: int) -> None:
    """Start ``pid``'s peak resident memory (``VmHWM``) over from its current size (Linux 4.0+)."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")


def peak_rss_kib(pid: int) -> int:
    """The most resident memory process ``pid`` had since it started or since :func:`reset_peak_rss`.

    Read by the kernel, so nothing polls the process (or competes for the CPU with what is measured).
    """
    return _status_kib(pid, "VmHWM")


def cpu_s(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used, in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fds(pid: int) -> int:
    """File descriptors process ``pid`` holds open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def _get(base_url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(base_url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def readyz(base_url: str) -> dict[str, Any]:
    status, body = _get(base_url, "/readyz")
    data = json.loads(body)
    data["http_status"] = status
    return data  # type: ignore[no-any-return]


def metric(base_url: str, name: str, headers: dict[str, str] | None = None) -> float | None:
    """The value of an unlabelled sample ``name`` in ``/metrics`` (None: absent)."""
    status, body = _get(base_url, "/metrics", headers)
    assert status == 200, (status, body[:200])
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None
