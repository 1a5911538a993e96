"""Image platforms (``os/architecture[/variant]``) and how a host's platform matches them.

Matching is Docker's (containerd ``platforms.Only`` for one host platform, without the
32-bit fallbacks): the OS and architecture must be equal and the variant equal after
normalisation (``arm64`` is ``arm64/v8``, ``arm`` is ``arm/v7``, ``amd64/v1`` is ``amd64``).
Where a host names no platform, its CPU namespace says it (docs/reference/image-index.md).
"""

from __future__ import annotations

import platform as _platform
import re
from dataclasses import dataclass

from docker_variant.errors import InvalidInputError
from docker_variant.variant.model import SupportedLists

__all__ = ["BASELINE_HOSTS", "Platform", "host_platform", "platform_of_lists"]

_PART = re.compile(r"[a-z0-9_.-]+")

# platform.machine() and other spellings -> OCI architecture
_ARCHITECTURES = {
    "x86_64": "amd64",
    "x86-64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "armv6l": "arm",
    "arm": "arm",
    "i386": "386",
    "i686": "386",
}
_DEFAULT_VARIANTS = {"arm64": "v8", "arm": "v7"}
_NO_VARIANT = {("amd64", "v1")}

#: The CPU namespace a host's lists hold -> its platform.
_CPU_NAMESPACES = {"x86_64": "amd64", "aarch64": "arm64"}

#: A host with no accelerator and the baseline CPU of each platform: what a variant-unaware
#: client is assumed to run on (the first entry of a variant image index, docs/reference/image-index.md).
BASELINE_HOSTS: dict[str, SupportedLists] = {
    "amd64": {"x86_64": {"level": ["v1"]}},
    "arm64": {"aarch64": {"version": ["8a"]}},
}


@dataclass(frozen=True, order=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        base = f"{self.os}/{self.architecture}"
        return f"{base}/{self.variant}" if self.variant else base

    @classmethod
    def parse(cls, text: str, where: str = "platform") -> Platform:
        """``linux/arm64``, ``linux/arm64/v8``; architecture spellings are normalised."""
        parts = text.strip().lower().split("/") if isinstance(text, str) else []
        if not 2 <= len(parts) <= 3 or not all(_PART.fullmatch(p) for p in parts):
            raise InvalidInputError(
                f"{where}: {text!r} is not a platform; expected os/arch[/variant], "
                "e.g. linux/amd64 or linux/arm64/v8"
            )
        return cls.of(*parts)

    @classmethod
    def of(cls, os: str, architecture: str, variant: str | None = "") -> Platform:
        """A platform as an image config or index descriptor states it, normalised."""
        arch = _ARCHITECTURES.get(architecture, architecture)
        wanted = (variant or "").lower()
        if architecture == "armv6l":
            wanted = wanted or "v6"
        if (arch, wanted) in _NO_VARIANT:
            wanted = ""
        return cls(os, arch, wanted)

    def normalized(self) -> Platform:
        return Platform(
            self.os, self.architecture, self.variant or _DEFAULT_VARIANTS.get(self.architecture, "")
        )

    def matches(self, image: Platform) -> bool:
        """Whether a host of this platform runs an image built for ``image``."""
        return self.normalized() == image.normalized()

    def descriptor(self) -> dict[str, str]:
        """The ``platform`` object of an OCI descriptor."""
        data = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            data["variant"] = self.variant
        return data


def host_platform() -> Platform:
    """This machine's platform, as the Docker engine on it pulls by default."""
    machine = _platform.machine().lower()
    return Platform.of("linux", machine)


def platform_of_lists(lists: SupportedLists) -> Platform | None:
    """The platform a host's supported lists imply: its CPU namespace, if exactly one."""
    found = {arch for ns, arch in _CPU_NAMESPACES.items() if lists.get(ns)}
    if len(found) != 1:
        return None
    return Platform("linux", found.pop())
