"""The demo on embedded defaults (README's first command): a local registry, variant-proxy
and Docker engine; seven images of one app version; pulls as four different hosts.

Everything runs in a temp dir, listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import devstack
from docker_variant.providers.nvidia import nvidia_features

#: The example matrix and its build context (``examples/demo`` in the repository).
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "demo"
APP = "demo/app"
VERSION = "1.0.0"
# The variant labels examples/demo/variants.toml builds, besides the bare image.
LABELS = ("cpu", "v3", "cu126", "cu128", "rocm64", "null")
#: An MI300X node's sysfs (KFD topology, amdgpu driver 6.12.12, ROCm 6.4): read with --host-root.
MI300X_ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hostroot" / "mi300x"
SIMULATED_HOSTS = {
    "an H200 on an R570 driver (CUDA 12.8)": {
        "nvidia": nvidia_features((12, 8), (9, 0)),
        "x86_64": {"level": ["v4", "v3", "v2", "v1"]},
    },
    "an A100 on an old R550 driver (CUDA 12.4), x86-64-v2 CPU": {
        "nvidia": nvidia_features((12, 4), (8, 0)),
        "x86_64": {"level": ["v2", "v1"]},
    },
}


class Demo:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env

    def run(self, *args: str, show: bool = True) -> str:
        if show:
            print(f"$ {' '.join(args)}", flush=True)
        result = subprocess.run(list(args), env=self.env, text=True, stdout=subprocess.PIPE)
        if result.returncode != 0:
            raise SystemExit(f"demo: {args[0]} {args[1]} failed with exit code {result.returncode}")
        if show and result.stdout.strip():
            print(result.stdout.rstrip(), flush=True)
        return result.stdout

    def build_and_publish(self, registry: str) -> None:
        """The seven images from one Dockerfile and the example matrix, pushed, and the
        variant image index written at VERSION."""
        ref = f"{registry}/{APP}:{VERSION}"
        self.run(
            "docker", "variant", "build", "--matrix", str(EXAMPLE / "variants.toml"),
            "--publish", ref, str(EXAMPLE),
        )  # fmt: skip
        self.run("skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}")
        for label in [*LABELS, None]:  # so that the pulls really download
            tag = f"{VERSION}-{label}" if label else VERSION
            self.run("docker", "rmi", "-f", f"{registry}/{APP}:{tag}", show=False)


def main() -> None:
    print("== starting a registry, Redis, variant-proxy and a Docker engine on 127.0.0.1")
    with devstack.local_stack("dv-demo-", shared_cache=True) as stack:
        assert stack.proxy is not None and stack.engine is not None
        print(
            f"   registry {stack.registry.address}, proxy {stack.proxy.address}, engine {stack.engine.address}"
        )
        demo = Demo(stack.root, stack.client_env())
        demo.run("docker-variant", "install-plugin")

        print("\n== building and publishing seven images of one version through the proxy")
        demo.build_and_publish(stack.proxy.address)

        ref = f"{stack.proxy.address}/{APP}:{VERSION}"
        print("\n== what this host sees", flush=True)
        demo.run("docker-variant", "providers")
        demo.run("docker", "variant", "ls", ref)

        choices = {"this host": demo.run("docker", "variant", "pull", ref).strip()}
        for name, host in SIMULATED_HOSTS.items():
            path = stack.root / f"host-{len(choices)}.json"
            path.write_text(json.dumps(host))
            print(f"\n== pulling as {name}", flush=True)
            choices[name] = demo.run(
                "docker", "variant", "pull", "--providers-file", str(path), ref
            ).strip()
        print("\n== pulling as an MI300X node (its sysfs read with --host-root)", flush=True)
        choices["an MI300X node (KFD sysfs, driver 6.12.12)"] = demo.run(
            "docker", "variant", "pull", "--host-root", str(MI300X_ROOT), ref
        ).strip()  # fmt: skip
        print("\n== local tags (REF and each chosen variant share one image ID)", flush=True)
        demo.run(
            "docker",
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}  {{.ID}}",
            f"{stack.proxy.address}/{APP}",
        )

        print("\n== choices", flush=True)
        for name, line in choices.items():
            print(f"  {name:58} {line}")
    print("\n== stopped everything the demo started; removed", stack.root)


if __name__ == "__main__":
    main()
