"""A made-up accelerator vendor in one module, as a new vendor would be written: ``fakenpu``.

Its devices have a generation (``gen``: a device of generation 3 runs code for ``g3``, ``g2``
and ``g1``, newest first) and a runtime (``runtime``: the ``major.minor`` its driver runs).
The detector reads ``sys/class/fakenpu/<id>/{generation,runtime}`` under the host root; the
contents rules read ELF headers whose machine is ``fakenpu-gN``; the DRA driver
``npu.fake.example`` publishes ``generation`` (an int) and ``runtimeVersion`` (a version).
``test_vendor_registry`` registers ``VENDOR`` and sees it in every layer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from docker_variant.providers.hostroot import HostRoot
from docker_variant.vendors import (
    ContentsRules,
    Described,
    Detector,
    Interval,
    Threshold,
    Vendor,
)
from docker_variant.vendors.base import DraMapping, NamespaceRules, ValueRule, clauses_in_order
from docker_variant.vendors.evidence import ELF, ImageEvidence, Proposed, Verdict

NAMESPACE = "fakenpu"
DRA_DOMAIN = "npu.fake.example"
PRODUCTS = {3: "Fake N3", 2: "Fake N2"}
_GEN = re.compile(r"g([1-9][0-9]?)")
_RUNTIME = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})")
_ATTRIBUTES = f'device.attributes["{DRA_DOMAIN}"]'


def _gen(value: str) -> int | None:
    match = _GEN.fullmatch(value)
    return None if match is None else int(match[1])


def _order_key(feature: str, value: str) -> tuple[int, ...] | None:
    if feature == "gen":
        gen = _gen(value)
        return None if gen is None else (gen,)
    match = _RUNTIME.fullmatch(value) if feature == "runtime" else None
    return None if match is None else (int(match[1]), int(match[2]))


def lists_of(generation: int, runtime: str | None) -> dict[str, list[str]]:
    """A device's lists: every generation up to its own, newest first, and its runtime."""
    lists = {"gen": [f"g{n}" for n in range(generation, 0, -1)]}
    return lists | ({"runtime": [runtime]} if runtime else {})


# --------------------------------------------------------------------------- describe


def describe(lists: Mapping[str, Sequence[str]]) -> Described:
    gens = lists.get("gen", ())
    gen = _gen(gens[0]) if gens else None
    product = (
        None if gen is None else f"gen {gen}" + (f" ({PRODUCTS[gen]})" if gen in PRODUCTS else "")
    )
    runtime = lists.get("runtime", ())
    return Described(product, f"FakeRT {runtime[0]}" if runtime else None)


# --------------------------------------------------------------------------- contents


def _generations(evidence: ImageEvidence) -> list[tuple[str, int]]:
    """(path, generation) of every ELF built for the NPU."""
    found = []
    for finding in evidence.of_kind(ELF):
        if finding.value.startswith("fakenpu-") and (gen := _gen(finding.value[8:])):
            found.append((finding.path, gen))
    return found


def propose(evidence: ImageEvidence) -> Proposed:
    """The newest generation every NPU ELF runs on: the highest any of them needs."""
    found = _generations(evidence)
    if not found:
        return Proposed()
    return Proposed((("gen", f"g{max(gen for _, gen in found)}"),))


def verify(
    evidence: ImageEvidence, features: Mapping[str, Sequence[str]], verdict: Verdict
) -> None:
    """A ``gen`` below what an ELF needs is refused."""
    found = _generations(evidence)
    for value in features.get("gen", ()):
        gen = _gen(value)
        if gen is None or not found:
            continue
        verdict.checked.append(f"fakenpu :: gen :: {value}")
        for path, needed in found:
            if needed > gen:
                verdict.errors.append(
                    f"fakenpu :: gen :: {value}: {path} needs generation {needed}"
                )


def label_part(feature: str, value: str) -> str | None:
    return "npu" + value[1:] if feature == "gen" else None


# --------------------------------------------------------------------------- DRA


def _guard(feature: str) -> str | None:
    name = {"gen": "generation", "runtime": "runtimeVersion"}.get(feature)
    return None if name is None else f"has({_ATTRIBUTES}.{name})"


def _clause(feature: str, value: str) -> str | None:
    if feature == "gen":
        gen = _gen(value)
        return None if gen is None else f"{_ATTRIBUTES}.generation >= {gen}"
    match = _RUNTIME.fullmatch(value)
    if match is None:
        return None
    return f'{_ATTRIBUTES}.runtimeVersion.compareTo(semver("{match[1]}.{match[2]}.0")) == 0'


def _clauses(feature: str, values: Sequence[str], limit: int) -> tuple[list[str], list[str]]:
    return clauses_in_order(RULES.newest_first(feature, values), partial(_clause, feature), limit)


# --------------------------------------------------------------------------- detector


@dataclass(frozen=True)
class FakeReport:
    host: dict[str, list[str]] = field(default_factory=dict)
    devices: dict[str, dict[str, dict[str, list[str]]]] = field(default_factory=dict)


def detect(root: HostRoot, env: Mapping[str, str]) -> FakeReport:
    """Each ``sys/class/fakenpu/<id>``: its generation and runtime; the host lists those of
    its newest device."""
    devices = {}
    for path in root.entries("sys/class/fakenpu"):
        generation = root.first_line(path / "generation")
        if generation is not None and generation.isdigit():
            lists = lists_of(int(generation), root.first_line(path / "runtime"))
            devices[path.name] = {NAMESPACE: lists}
    newest = max((d[NAMESPACE] for d in devices.values()), key=len, default={})
    return FakeReport(newest, devices)


# --------------------------------------------------------------------------- list shapes


def _generation_interval(value: str) -> Interval | None:
    """A device of generation t lists ``gN`` for every t >= N."""
    gen = _gen(value)
    return None if gen is None else (gen, None)


#: a device's ``gen`` list is fixed by its generation: one node label says it
GEN_SHAPE = Threshold(lambda t: lists_of(t, None)["gen"], _gen, _generation_interval, highest=True)


RULES = NamespaceRules(
    NAMESPACE,
    ("gen", "runtime"),
    multi_value=frozenset({"gen"}),
    values={
        "gen": ValueRule(_GEN, "a generation such as g3"),
        "runtime": ValueRule(_RUNTIME, "a runtime major.minor such as 2.1"),
    },
    order_key=_order_key,
    dra=DraMapping(DRA_DOMAIN, f"{DRA_DOMAIN}/productName", _guard, _clauses),
)
VENDOR = Vendor(
    RULES,
    describe=describe,
    contents=ContentsRules(frozenset({"gen"}), propose, verify, label_part),
    detector=Detector("fakevendor:detect", "fake sysfs under {root}"),
    list_shapes={"gen": GEN_SHAPE},
)
