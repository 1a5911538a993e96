"""Print the requirements that ROOT (a distribution in WHEELHOUSE, with extras if named) and its dependencies need on
*this* interpreter and that no wheel in WHEELHOUSE satisfies, one per line.

Run by the image's own Python (Debian's), whose environment markers may differ from the build
host's (``python_full_version < "3.11.3"`` holds for Debian 12's 3.11.2): the host downloads
what is printed, and the image's pip then installs offline. Uses pip's vendored ``packaging``,
since the image's venv has nothing else."""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename


def main(wheelhouse: Path, root: str) -> None:
    available: dict[str, str] = {}  # name -> version
    requires: dict[str, list[Requirement]] = {}  # name -> its Requires-Dist
    for wheel in sorted(wheelhouse.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        available[name] = str(version)
        with zipfile.ZipFile(wheel) as archive:
            metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            headers = Parser().parsestr(archive.read(metadata).decode("utf-8"))
        requires[name] = [Requirement(line) for line in headers.get_all("Requires-Dist") or []]
    # walk the requirements that apply here, from the root, with the extras asked of each
    missing: set[str] = set()
    seen: set[tuple[str, str]] = set()
    wanted_root = Requirement(root)  # ``docker-variant[server]``: with those extras
    todo = [(canonicalize_name(wanted_root.name), e) for e in ("", *wanted_root.extras)]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for requirement in requires.get(name, []):
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
                continue
            wanted = canonicalize_name(requirement.name)
            version = available.get(wanted)
            if version is None or not requirement.specifier.contains(version, prereleases=True):
                missing.add(f"{requirement.name}{requirement.specifier}")
                continue
            todo += [(wanted, e) for e in ("", *requirement.extras)]
    for requirement_text in sorted(missing):
        print(requirement_text)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
