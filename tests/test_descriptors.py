"""Device descriptors: NPUs described as data, matched against PCI sysfs under a host root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clirun import run_cli
from docker_variant.errors import InvalidInputError
from docker_variant.providers import detect_host
from docker_variant.providers.descriptors import descriptor_dirs, read_descriptors

ROOT = Path(__file__).parent.parent
HOSTS = ROOT / "tests" / "fixtures" / "hostroot"
EXAMPLES = ROOT / "examples" / "providers.d"
WARBOY = {"arch": ["warboy"], "driver_version": ["1.9.2"]}


def env_for(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config")}


def detect(tmp_path: Path, host: str, descriptors: Path | None = EXAMPLES, **kw: object):  # type: ignore[no-untyped-def]
    return detect_host(
        env=env_for(tmp_path),
        host_root=HOSTS / host,
        descriptors=descriptors,
        use_cache=False,
        **kw,  # type: ignore[arg-type]
    )


def test_warboy_host(tmp_path: Path) -> None:
    report = detect(tmp_path, "warboy")
    assert report.host["furiosa"] == WARBOY
    assert report.devices["furiosa"] == {
        "0000:17:00.0": {"furiosa": WARBOY},
        "0000:65:00.0": {"furiosa": WARBOY},
    }
    assert report.sources["furiosa"] == f"descriptor {EXAMPLES / 'furiosa-warboy.toml'}"
    # described, but no such device on this host: an empty namespace, as absent hardware
    assert report.host["habana"] == {} and "habana" not in report.devices
    assert "habana" not in report.sources
    assert report.host["amd"] == {}


def test_gaudi2_and_a_host_without_npus(tmp_path: Path) -> None:
    report = detect(tmp_path, "gaudi2")
    assert report.host["habana"] == {"arch": ["gaudi2"], "driver_version": ["1.17.0"]}
    assert len(report.devices["habana"]) == 8
    for host in ("empty", "mi300x"):
        report = detect(tmp_path, host)
        assert report.host["furiosa"] == {} and report.host["habana"] == {}
        assert "furiosa" not in report.devices and "habana" not in report.devices


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


def test_lists_merge_in_first_seen_order_and_the_xdg_dir_is_read(tmp_path: Path) -> None:
    xdg = tmp_path / "config" / "docker-variant" / "providers.d"
    write(
        xdg,
        "furiosa.toml",
        'namespace = "furiosa"\n'
        '[[device]]\npci_vendor = "0x8086"\nfeatures = { arch = ["nic", "warboy"] }\n'
        '[[device]]\npci_vendor = "0x1ed2"\nfeatures = { arch = ["warboy", "rngd"] }\n',
    )
    report = detect(tmp_path, "warboy", descriptors=None)
    # devices in address order: 17:00.0 warboy, 31:00.0 the Intel "nic", 65:00.0 warboy
    assert report.host["furiosa"] == {"arch": ["warboy", "rngd", "nic"]}
    assert report.devices["furiosa"]["0000:31:00.0"] == {"furiosa": {"arch": ["nic", "warboy"]}}
    # a --descriptors directory's furiosa replaces the user's
    assert detect(tmp_path, "warboy").host["furiosa"] == WARBOY


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('namespace = "furiosa"\nbogus = 1\n', "bogus: unknown key"),
        (
            'namespace = "nvidia"\n[[device]]\npci_vendor = "0x10de"\nfeatures = {a = ["b"]}\n',
            "namespace: 'nvidia' is a built-in namespace",
        ),
        ('namespace = "amd"\n', "namespace: 'amd' is a built-in namespace"),
        ('namespace = "Furiosa"\n', "namespace: 'Furiosa' is not a name"),
        ('namespace = "furiosa"\n', "device: missing"),
        (
            'namespace = "f"\n[[device]]\npci_vendor = "1ed2"\nfeatures = {a = ["b"]}\n',
            "device[0].pci_vendor: '1ed2' is not a PCI ID",
        ),
        (
            'namespace = "f"\n[[device]]\npci_vendor = "0x1ed2"\nfeatures = {a = ["B-1"]}\n',
            "device[0].features.a: 'B-1' is not a value",
        ),
        (
            'namespace = "f"\n[[device]]\npci_vendor = "0x1ed2"\nfeatures = {a = ["b"]}\nname = 1\n',
            "device[0].name: unknown key",
        ),
        (
            'namespace = "f"\n[[device]]\npci_vendor = "0x1ed2"\nfeatures = {a = []}\n',
            "device[0].features.a: expected a non-empty list",
        ),
        (
            'namespace = "f"\n[[device]]\npci_vendor = "0x1ed2"\nfeatures = {a = ["b"]}\n'
            '[[file]]\nfeature = "v"\npath = "../etc/passwd"\n',
            "file[0].path",
        ),
        (
            'namespace = "f"\n[[device]]\npci_vendor = "0x1ed2"\nfeatures = {a = ["b"]}\n'
            '[[file]]\nfeature = "v"\n',
            "file[0].path: missing",
        ),
        ("namespace = [[[", "not valid TOML"),
        ("a = " + "[" * 2000 + "]" * 2000, "descriptor"),
    ],
)
def test_bad_descriptors_name_the_file_and_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path / "d", "bad.toml", text)
    with pytest.raises(InvalidInputError) as caught:
        detect(tmp_path, "warboy", descriptors=tmp_path / "d")
    message = str(caught.value)
    assert str(path) in message and key in message, message
    assert "\n" not in message


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "symlink-loop", "huge", "not-utf8"])
def test_hostile_descriptor_files_are_refused_without_waiting(tmp_path: Path, kind: str) -> None:
    """Where a descriptor should be: a FIFO nobody writes (opened without blocking), a link
    to /dev/zero (never read on), a symlink loop, a file over the size bound, bytes that
    are not UTF-8. Each is one line naming the file, never a hang."""
    folder = tmp_path / "d"
    folder.mkdir()
    path = folder / "x.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "symlink-loop":
        path.symlink_to(folder / "y.toml")
        (folder / "y.toml").symlink_to(path)
    elif kind == "huge":
        path.write_bytes(b"# " + b"x" * (2 << 20))
    else:
        path.write_bytes(b'namespace = "\xff"\n')
    with pytest.raises(InvalidInputError) as caught:
        read_descriptors([folder])
    message = str(caught.value)
    assert str(path) in message and "\n" not in message, message


def test_two_files_of_one_directory_for_one_namespace(tmp_path: Path) -> None:
    one = 'namespace = "f"\n[[device]]\npci_vendor = "0x1ed2"\nfeatures = {a = ["b"]}\n'
    write(tmp_path / "d", "a.toml", one)
    write(tmp_path / "d", "b.toml", one)
    with pytest.raises(InvalidInputError, match=r"b\.toml: namespace: 'f' is described by"):
        read_descriptors([tmp_path / "d"])


def test_the_descriptors_option_and_env(tmp_path: Path) -> None:
    env = {**env_for(tmp_path), "DOCKER_VARIANT_DESCRIPTORS": str(EXAMPLES)}
    assert descriptor_dirs(None, env)[-1] == EXAMPLES
    with pytest.raises(InvalidInputError, match="--descriptors"):
        descriptor_dirs(tmp_path / "missing", env)
    with pytest.raises(InvalidInputError, match="DOCKER_VARIANT_DESCRIPTORS"):
        descriptor_dirs(None, {**env, "DOCKER_VARIANT_DESCRIPTORS": str(tmp_path / "nope")})


def _opt_in_stub(monkeypatch: pytest.MonkeyPatch, namespace: str, feature: str, value: str) -> None:
    """``--enable-provider NAMESPACE`` finds a plugin answering ``feature`` = [``value``]."""
    from docker_variant.providers import plugins

    class Stub:
        @classmethod
        def get_supported_configs(cls) -> list[plugins.FeatureConfig]:
            return [plugins.FeatureConfig(feature, [value])]

    Stub.namespace = namespace  # type: ignore[attr-defined]
    monkeypatch.setattr(
        "docker_variant.providers.plugins.find_plugin",
        lambda name: plugins.PluginAdapter(Stub),
    )


def test_an_enabled_plugin_replaces_the_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _opt_in_stub(monkeypatch, "furiosa", "arch", "renegade")
    report = detect(tmp_path, "warboy", enable=["furiosa"])
    assert report.host["furiosa"] == {"arch": ["renegade"]}
    assert "furiosa" not in report.devices
    assert report.sources["furiosa"].startswith("plugin furiosa")
    assert "replaces descriptor" in report.sources["furiosa"]


def test_an_enabled_amd_plugin_replaces_the_built_in_detection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an opted-in nvidia plugin answers for nvidia: the plugin's lists, not the KFD's."""
    _opt_in_stub(monkeypatch, "amd", "gfx_arch", "gfx90a")
    assert detect(tmp_path, "mi300x").host["amd"]["gfx_arch"] == ["gfx942"]  # the KFD's
    report = detect(tmp_path, "mi300x", enable=["amd"])
    assert report.host["amd"] == {"gfx_arch": ["gfx90a"]}
    assert "amd" not in report.devices
    assert report.sources["amd"] == "plugin amd (--enable-provider)"


def test_the_cli_options_before_or_after_the_command(tmp_path: Path) -> None:
    import json

    env = env_for(tmp_path)
    given = ("--host-root", str(HOSTS / "warboy"), "--descriptors", str(EXAMPLES))
    before = run_cli(*given, "providers", "--devices", "--json", env=env, tmp=tmp_path)
    after = run_cli("providers", "--devices", "--json", *given, env=env, tmp=tmp_path)
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)
    data = json.loads(before.stdout)
    assert data["host"]["furiosa"] == WARBOY and len(data["devices"]["furiosa"]) == 2
    assert data["sources"]["furiosa"].startswith("descriptor ")
    table = run_cli(*given, "providers", env=env, tmp=tmp_path)
    assert "furiosa answered by descriptor" in table.stdout
    bad = tmp_path / "bad"
    write(bad, "x.toml", 'namespace = "x86_64"\n')
    done = run_cli("--descriptors", str(bad), "providers", env=env, tmp=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{bad / 'x.toml'}: namespace:" in done.stderr
