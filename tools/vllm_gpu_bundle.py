"""vLLM for the GPU machine, which has no package registry: pack it here, install it there.

`pack` (here, where requirements/vllm-VERSION.txt is installed and a registry answers) writes
build/vllm-gpu/: vLLM's Python files and dist-info as one tar.gz (its compiled extensions
stay behind: the harness runs vLLM with the CPU platform and real CUDA streams, docs/spec.md
§10), and Python 3.12 wheels of each distribution the execution path imports that the GPU
image does not ship, at the versions pinned in that file. The whole is about
27 MiB, inside what a device call carries.

`install` (there) installs the bundle into build/vllm-gpu/site without a registry and
checks that vLLM's execution modules import; it prints the directory to put on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "build" / "vllm-gpu"
# The distributions the GPU machine's image already ships (its package list, 2026-11): their
# versions there satisfy vLLM 0.33.0's ranges, so they are not carried.
ON_GPU_IMAGE = frozenset(
    "aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer "
    "cloudpickle einops filelock frozenlist h11 hf-xet huggingface-hub idna jinja2 markupsafe "
    "mpmath multidict networkx numpy packaging pillow prometheus-client propcache psutil "
    "py-cpuinfo pyyaml regex requests rich safetensors setuptools sympy tokenizers torch tqdm "
    "transformers typing-extensions urllib3 uvloop yarl".split())
WHEEL_PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
                   "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                   "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
# What the harness imports of vLLM's execution path (harness/vllm_exec/runtime.py).
PROBE = ("import os; os.environ.setdefault('VLLM_TARGET_DEVICE', 'cpu'); "
         "import harness.vllm_exec.runtime")


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def pinned(requirements: Path) -> dict[str, str]:
    pins = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[canonical(name)] = version
    return pins


def imported_distributions() -> set[str]:
    """The distributions whose modules the execution path loads, found by importing it in a
    fresh interpreter here and mapping each loaded module's top-level name to its owner."""
    code = PROBE + "; import sys; print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
                         check=True).stdout.split()
    owners = metadata.packages_distributions()
    return {canonical(d) for top in out for d in owners.get(top, ())}


def carried(pins: dict[str, str]) -> list[str]:
    """The distributions the bundle carries as wheels: imported by the execution path,
    pinned, not shipped by the GPU image (vLLM itself goes as its Python files)."""
    return sorted(d for d in imported_distributions() & pins.keys()
                  if d not in ON_GPU_IMAGE and d != "vllm")


def pack(requirements: Path) -> int:
    pins = pinned(requirements)
    wanted = carried(pins)
    wheels = BUNDLE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    platforms = [f"--platform={p}" for p in WHEEL_PLATFORMS]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                    "cp", *platforms, "-d", str(wheels), *(f"{d}=={pins[d]}" for d in wanted)],
                   check=True, timeout=900)
    vllm = metadata.distribution("vllm")
    site = Path(vllm.locate_file(""))
    with tarfile.open(BUNDLE / "vllm-py.tar.gz", "w:gz") as tar:
        for entry in vllm.files or ():
            path = str(entry)
            if path.endswith(".py") or ".dist-info/" in path:
                tar.add(site / path, arcname=path)
    size = sum(f.stat().st_size for f in BUNDLE.rglob("*") if f.is_file()) / 2**20
    print(f"{BUNDLE.relative_to(ROOT)}: vllm {vllm.version} and {len(wanted)} wheels, "
          f"{size:.1f} MiB")
    return 0


def install(bundle: Path = BUNDLE) -> int:
    if not (bundle / "vllm-py.tar.gz").exists():
        print(f"{bundle} holds no bundle: run `make vllm-gpu-bundle` where a package registry "
              "answers, and carry build/vllm-gpu", file=sys.stderr)
        return 2
    site = bundle / "site"
    packed = _packed_version(bundle)
    marker = site / ".installed"
    if not marker.exists() or marker.read_text().strip() != packed:
        if site.exists():
            shutil.rmtree(site)  # another release's files would shadow this one's
        wheels = sorted(str(w) for w in (bundle / "wheels").glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                        "--no-deps", "--no-compile", "--upgrade", "--target", str(site),
                        *wheels], check=True, timeout=600)
        with tarfile.open(bundle / "vllm-py.tar.gz") as tar:
            tar.extractall(site, filter="data")
        marker.write_text(packed)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, timeout=300,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"vLLM from the bundle does not import here: {last}", file=sys.stderr)
        return 1
    print(site)
    return 0


def _packed_version(bundle: Path) -> str:
    """The vLLM version inside the bundle, from its dist-info's name."""
    with tarfile.open(bundle / "vllm-py.tar.gz") as tar:
        for name in tar.getnames():
            top = name.split("/")[0]
            if top.startswith("vllm-") and top.endswith(".dist-info"):
                return top[len("vllm-"):-len(".dist-info")]
    return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["pack", "install"])
    parser.add_argument("--requirements", type=Path,
                        default=ROOT / "requirements" / "vllm-0.34.0.txt",
                        help="the pins of the release packed (requirements/vllm-VERSION.txt)")
    args = parser.parse_args()
    return pack(args.requirements) if args.action == "pack" else install()


if __name__ == "__main__":
    sys.exit(main())
