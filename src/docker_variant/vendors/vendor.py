"""A vendor: one namespace's rules and every hook the layers above ask of it.

Each vendor module builds one ``Vendor`` and ``vendors.register`` adds it to the registry;
every other package loops over the registry (``vendors.registered()``,
``vendors.vendor_of(ns)``) and never names a vendor:

- ``rules``: features, value grammar, value order, the DRA mapping (``NamespaceRules``);
- ``describe``: a device's lists in the vendor's words (``providers`` device titles and
  ``ls``'s choice note, the scheduler's fleet page and metrics);
- ``contents``: what the binaries say (``inspect``, ``labels --from-image``, the
  ``push``/``publish`` label checks) and the vendor's part of a proposed label (``cu128``);
- ``detector``: the host detection under ``providers/``, named by ``"module:function"`` and
  imported only when detection runs, since ``vendors/`` sits below ``providers/``.

A namespace with no vendor (a device descriptor's, a third-party plugin's) is taken as
declared: ``vendors.generic_rules``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from docker_variant.vendors.base import DraMapping, NamespaceRules
from docker_variant.vendors.evidence import ImageEvidence, Proposed, Verdict

__all__ = ["ContentsRules", "Described", "Detector", "Vendor"]

Lists = Mapping[str, Sequence[str]]  # one namespace's lists: feature -> values, best first


@dataclass(frozen=True)
class Described:
    """What a device's lists say of it: its product (``sm 9.0 (H100, H200, GH200)``) and
    driver (``CUDA 12.8 (R570)``); ``None`` where they say nothing."""

    product: str | None = None
    driver: str | None = None


def _no_label_part(feature: str, value: str) -> str | None:
    return None


@dataclass(frozen=True)
class ContentsRules:
    """What an image's binaries say of the namespace.

    ``propose(evidence)``: the properties the binaries support; ``verify(evidence, features,
    verdict)``: adds to ``verdict`` what the labels' ``features`` (feature -> values) promise
    beyond the binaries; ``checked``: the features ``verify`` can confirm or refute (images
    labelled with none of any vendor's are not read). ``label_part(feature, value)``: the
    vendor's part of a proposed label (``cu128``, ``rocm62``); ``bare_label``: the label when
    the vendor proposed properties but no vendor gave a part (``cuda``)."""

    checked: frozenset[str]
    propose: Callable[[ImageEvidence], Proposed]
    verify: Callable[[ImageEvidence, Lists, Verdict], None]
    label_part: Callable[[str, str], str | None] = _no_label_part
    bare_label: str | None = None


@dataclass(frozen=True)
class Detector:
    """The vendor's host detection: ``target`` is ``"module:function"``, the function taking
    ``(root: HostRoot, env)`` and answering an object with ``host`` (the namespace's lists)
    and ``devices`` (device id -> ``{namespace: lists}``). ``source`` is what ``providers``
    says answered (``{root}``: the host root); ``cached``: slow to ask (NVML), so its answer
    is kept with the CPU plugins' (``providers.cache``)."""

    target: str
    source: str
    cached: bool = False


@dataclass(frozen=True)
class Vendor:
    """One namespace's rules and hooks; ``device``: whether it describes devices (an
    accelerator) rather than the node (a CPU namespace)."""

    rules: NamespaceRules
    describe: Callable[[Lists], Described] | None = None
    contents: ContentsRules | None = None
    detector: Detector | None = None
    device: bool = True

    @property
    def namespace(self) -> str:
        return self.rules.namespace

    @property
    def dra(self) -> DraMapping | None:
        return self.rules.dra
