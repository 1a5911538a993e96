"""``vendors.amd`` and the vendor lookup: value forms, order, names, the ROCm table."""

from __future__ import annotations

import pytest

from docker_variant import vendors
from docker_variant.errors import InvalidInputError
from docker_variant.vendors import amd, nvidia


def test_for_namespace_and_builtins() -> None:
    assert vendors.for_namespace("amd") is amd.RULES
    assert vendors.for_namespace("nvidia") is nvidia.RULES
    assert {"nvidia", "amd", "x86_64", "aarch64"} == vendors.builtin_namespaces()
    furiosa = vendors.for_namespace("furiosa")
    assert not furiosa.builtin and furiosa.dra is None
    furiosa.check_feature_values("arch", ["a", "b"], "x")  # several values: taken as declared


def test_value_forms_and_order() -> None:
    assert amd.gfx_value("gfx90a") == (9, 0, 10) and amd.gfx_value("gfx1100") == (11, 0, 0)
    assert amd.gfx_value("gfx") is None and amd.gfx_value("gfx9" + "0" * 5000) is None
    assert amd.newest_first("gfx_arch", ["gfx90a", "gfx1100", "gfx942", "gfx950"]) == [
        "gfx1100",
        "gfx950",
        "gfx942",
        "gfx90a",
    ]
    assert amd.newest_first("rocm_version", ["6.10", "7.0", "6.4"]) == ["7.0", "6.10", "6.4"]
    with pytest.raises(InvalidInputError, match="takes one value"):
        amd.RULES.check_feature_values("rocm_version", ["6.4", "6.3"], "x")
    with pytest.raises(InvalidInputError, match="is not a feature of the amd provider"):
        amd.RULES.check_feature_values("arch", ["gfx942"], "x")


def test_natural_order_never_turns_digits_into_ints() -> None:
    big = "9" * 5000
    assert vendors.newest_first("furiosa", "arch", ["v9", big, "v10"]) == [big, "v10", "v9"]


def test_names_and_description() -> None:
    assert amd.target_of_device(0x74A1) == "gfx942"
    assert amd.target_of_device(0x740F) == "gfx90a"
    assert amd.device_product(0x744C) == "Radeon RX 7900 XT/7900 XTX"
    assert amd.product_name("gfx90a") == "Instinct MI250X, MI250X/MI250, MI210"
    assert amd.product_name("gfx1036") is None
    assert vendors.describe("amd", {"gfx_arch": ["gfx950"]}) == "gfx950 (Instinct MI350X, MI355X)"
    assert vendors.nvidia.product_name((8, 9)) == "L4, L40S, RTX 40"
    assert vendors.nvidia.driver_branch((12, 8)) == "R570"
    assert vendors.describe("furiosa", {"arch": ["warboy"]}) == "arch warboy"


@pytest.mark.parametrize(
    ("module_version", "releases"),
    [
        ((6, 3, 6), ["6.2", "6.1", "6.0", "5.7", "5.6"]),
        ((6, 12, 12), ["7.0", "6.4", "6.3", "6.2", "6.1"]),
        ((6, 14, 14), ["7.0", "6.4", "6.3", "6.2"]),
        ((6, 2, 0), []),  # older than the table
        (None, []),  # no version file
    ],
)
def test_rocm_releases_of_a_driver(
    module_version: tuple[int, ...] | None, releases: list[str]
) -> None:
    assert amd.rocm_releases(module_version) == releases


def test_every_device_id_names_a_valid_target() -> None:
    assert all(amd.gfx_value(device.gfx) is not None for device in amd.DEVICES)
    assert len({device.device_id for device in amd.DEVICES}) == len(amd.DEVICES)
