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
  imported only when detection runs, since ``vendors/`` sits below ``providers/``;
- ``list_shapes``: how a host's list of a feature is made (one driver version fixes it, or
  each device's major and minor), so that Kubernetes node labels say it in a few labels.

A namespace with no vendor (a device descriptor's, a third-party plugin's) is taken as
declared: ``vendors.generic_rules``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from docker_variant.vendors.base import DraMapping, NamespaceRules
from docker_variant.vendors.evidence import ImageEvidence, Proposed, Verdict

__all__ = [
    "ContentsRules",
    "Described",
    "Detector",
    "Interval",
    "ListShape",
    "PerMajor",
    "Threshold",
    "Vendor",
]

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


#: The thresholds ``lo..hi`` (inclusive; ``None``: unbounded) whose lists hold a value.
Interval = tuple[int | None, int | None]


@dataclass(frozen=True)
class Threshold:
    """A feature whose host list one integer ``t`` fixes (a driver's CUDA version, as
    ``major * 100 + minor``; an x86-64 level): ``listed(t)`` is that list;
    ``candidate(value)`` the ``t`` whose list a host holding ``value`` may have (``None``:
    none); ``interval(value)`` the ``t`` whose lists hold ``value``; ``highest``: of several
    candidates whose lists a host holds, the greatest says the most."""

    listed: Callable[[int], list[str]]
    candidate: Callable[[str], int | None]
    interval: Callable[[str], Interval | None]
    highest: bool


@dataclass(frozen=True)
class PerMajor:
    """A feature each device lists from its ``(major, minor)`` (NVIDIA's ``sm_arch``):
    ``listed((major, minor))`` is one device's list, every device of a higher minor of the
    same major lists what a lower one does, and ``least(value)`` is the lowest device that
    lists ``value`` (``None``: no device lists it alone). ``shape`` says such a list in
    words."""

    listed: Callable[[tuple[int, int]], list[str]]
    least: Callable[[str], tuple[int, int] | None]
    shape: str


ListShape = Threshold | PerMajor


@dataclass(frozen=True)
class Vendor:
    """One namespace's rules and hooks; ``device``: whether it describes devices (an
    accelerator) rather than the node (a CPU namespace)."""

    rules: NamespaceRules
    describe: Callable[[Lists], Described] | None = None
    contents: ContentsRules | None = None
    detector: Detector | None = None
    device: bool = True
    list_shapes: Mapping[str, ListShape] = field(default_factory=dict)  # feature -> shape

    @property
    def namespace(self) -> str:
        return self.rules.namespace

    @property
    def dra(self) -> DraMapping | None:
        return self.rules.dra
