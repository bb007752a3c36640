"""The pins of the locks (locks/*.txt, universal resolutions by uv with markers), read as pip
would on one Python on Linux x86_64. Used by tests/deploy/test_locks.py, bench/prepare_device.sh
and bench/gpu_session.sh.

    python3 locks/pins.py [--python 3.12.3] LOCK...               # name==version, one a line
    python3 locks/pins.py --installed LOCK...                     # against this interpreter's packages

Needs the `packaging` module (pip has it; so does the test lock).
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def environment(python: str) -> dict[str, str]:
    """PEP 508 marker values of CPython `python` (e.g. "3.12.3") on Linux x86_64."""
    return {
        "python_version": ".".join(python.split(".")[:2]),
        "python_full_version": python,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }


def pins(lock: Path, python: str) -> dict[str, str]:
    """{canonical name: version} that pip installs from `lock` on `python`."""
    found: dict[str, str] = {}
    for line in Path(lock).read_text().splitlines():
        match = PIN.match(line)
        if not match:
            continue
        name, version, marker = match.groups()
        if marker is None or Marker(marker).evaluate(environment(python)):
            if canonicalize_name(name) in found:
                raise ValueError(f"{lock}: {name} pinned twice for Python {python}")
            found[canonicalize_name(name)] = version
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 locks/pins.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("locks", nargs="+", type=Path)
    parser.add_argument("--python", default=platform.python_version(), help="the Python to read them for [this one]")
    parser.add_argument("--skip", default="", help="names to leave out, space-separated")
    parser.add_argument("--installed", action="store_true", help="compare with this interpreter's packages")
    args = parser.parse_args(argv)
    merged: dict[str, str] = {}
    for lock in args.locks:
        for name, version in pins(lock, args.python).items():
            if merged.setdefault(name, version) != version:
                raise SystemExit(f"{name}: {merged[name]} and {version} in the locks given")
    skip = {canonicalize_name(name) for name in args.skip.split()}
    wanted = {name: version for name, version in sorted(merged.items()) if name not in skip}
    if not args.installed:
        print("".join(f"{name}=={version}\n" for name, version in wanted.items()), end="")
        return 0
    differ = 0
    for name, version in wanted.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "-"
        differ += installed != version
        print(f"{name:<32} {version:<16} {installed:<16} {'' if installed == version else 'differs'}")
    print(f"{differ} of {len(wanted)} differ from the locks on Python {platform.python_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
