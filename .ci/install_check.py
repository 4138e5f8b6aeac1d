"""The install as a user gets it, checked outside the clone (run by .ci/run with the project's venv).

1. Build the sdist and the wheel from the working tree's files (a copy: no build/ left over from an
   earlier build can slip into the wheel), then the wheel again from the sdist: the two wheels must
   hold the same files, byte for byte. The wheel must carry LICENSE, py.typed and every shipped
   pipeline, and its version must be dali_bridge.__version__.
2. Resolve ``pip install <wheel>`` as a user's pip would, against the package indexes, and check
   that it pulls in no DALI build (the ``[cuda12]``/``[cuda13]`` extras add one); in the background,
   beside steps 3 and 4, since it mostly waits on the network.
3. Install the wheel into a fresh environment in a temporary folder. torch, torchvision and the
   rest of the base requirements are not installed again: the new environment reads this venv's
   copies of exactly those distributions (links in a folder a .pth file names), so the step takes
   seconds and no other package, DALI above all, is visible there.
4. From an empty folder, with nothing of the clone on the path: ``--version``, the shipped
   pipelines by name (``dali-bridge run imagenet_train --data IMAGES --batches 2``, then every
   shipped pipeline), and the README's Python loop as printed.

Prints how long each step took; exits non-zero with the reason at the first failure.
"""
from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


class CheckFailed(Exception):
    """A check of the install failed; the message says which and what was found."""


def step(name: str):
    """Context manager timing one step and printing it."""
    class _Step:
        def __enter__(self):
            self.start = time.perf_counter()
            print(f"install check: {name} ...", flush=True)

        def __exit__(self, kind, *_):
            if kind is None:
                print(f"install check: {name}: {time.perf_counter() - self.start:.1f} s", flush=True)
    return _Step()


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``command``; its output in the failure's message."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise CheckFailed(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


# ---- 1. sdist and wheel

def copy_tree(destination: Path) -> None:
    """The working tree's files as git sees them (tracked, and new ones not ignored), links kept."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO).stdout
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, destination / name
        if not source.exists() and not source.is_symlink():  # deleted, not yet committed
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def build(source: Path, out: Path, *, sdist: bool) -> Path:
    """setuptools' PEP 517 hooks in a child process (this venv's setuptools: no isolated download)."""
    hook = "build_sdist" if sdist else "build_wheel"
    done = run([sys.executable, "-c", f"import sys; from setuptools import build_meta; "
                                      f"print(build_meta.{hook}(sys.argv[1]))", str(out)], cwd=source)
    return out / done.stdout.strip().splitlines()[-1]


def wheel_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def build_and_compare(work: Path) -> Path:
    source = work / "src"
    copy_tree(source)
    dist = work / "dist"
    sdist = build(source, dist, sdist=True)
    wheel = build(source, dist, sdist=False)
    with tarfile.open(sdist) as archive:  # the "data" filter where this Python has it (3.11.4 on)
        archive.extractall(work / "sdist", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    unpacked = next((work / "sdist").iterdir())
    again = build(unpacked, work / "from-sdist", sdist=False)
    ours, theirs = wheel_files(wheel), wheel_files(again)
    differ = sorted(name for name in set(ours) | set(theirs) if ours.get(name) != theirs.get(name))
    if differ:
        raise CheckFailed(f"the wheel built from the sdist differs from the one built from the tree: {differ}")
    check_wheel_contents(wheel, ours)
    return wheel


def check_wheel_contents(wheel: Path, files: dict[str, bytes]) -> None:
    version = re.search(r"^__version__ = \"([^\"]+)\"", (REPO / "dali_bridge" / "__init__.py").read_text(), re.M)
    if version is None or f"-{version.group(1)}-" not in wheel.name:
        raise CheckFailed(f"{wheel.name}: the version is not dali_bridge.__version__ ({version and version.group(1)})")
    shipped = sorted(path.name for path in (REPO / "pipelines").glob("*.yaml"))
    carried = sorted(Path(name).name for name in files if name.startswith("dali_bridge/pipelines/"))
    if carried != shipped:
        raise CheckFailed(f"{wheel.name} carries pipelines {carried}, the repository ships {shipped}")
    for needed in ("dali_bridge/py.typed", f"dali_bridge-{version.group(1)}.dist-info/licenses/LICENSE"):
        if needed not in files:
            raise CheckFailed(f"{wheel.name} lacks {needed}")


# ---- 2. what pip install resolves to

class Resolution:
    """``pip install WHEEL`` resolved from scratch (as for an empty environment) against the package
    indexes, in the background: it waits on the network while the other steps use the cores."""

    def __init__(self, wheel: Path, work: Path):
        self.wheel, self.report, self.start = wheel, work / "resolution.json", time.perf_counter()
        self.process = subprocess.Popen([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                                         "--quiet", "--report", str(self.report), str(wheel)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def check(self) -> list[str]:
        """The distributions it resolves to; :class:`CheckFailed` if it fails or holds a DALI build."""
        output, _ = self.process.communicate()
        seconds = time.perf_counter() - self.start
        if self.process.returncode != 0:
            raise CheckFailed(f"pip install --dry-run {self.wheel.name} exited {self.process.returncode}:\n{output}")
        names = sorted(item["metadata"]["name"] for item in json.loads(self.report.read_text())["install"])
        dali = [name for name in names if canonicalize_name(name).startswith("nvidia-dali")]
        if dali:
            raise CheckFailed(f"pip install {self.wheel.name} resolves to DALI builds {dali}; they belong in "
                              f"the extras")
        print(f"install check: pip install {self.wheel.name} resolved from the indexes in {seconds:.1f} s (beside "
              f"the steps above) to {len(names)} distributions, no DALI build: {', '.join(names)}", flush=True)
        return names


# ---- 3. a fresh environment reusing this venv's base requirements

def base_closure(wheel: Path) -> set[str]:
    """The installed distributions the wheel's base requirements need (see :func:`closure`)."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode()
    return closure([Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
                    if line.startswith("Requires-Dist:")])


def closure(requirements: list[Requirement], extras: tuple[str, ...] = ("",)) -> set[str]:
    """The installed distributions ``requirements`` need, recursively: markers evaluated here for
    ``extras``, and a requirement's own extras followed (torch asks for ``cuda-toolkit[cublas,...]``)."""
    pending = [(requirement, extras) for requirement in requirements]
    found: dict[str, set[str]] = {}
    while pending:
        requirement, wanted_by = pending.pop()
        if requirement.marker is not None and not any(requirement.marker.evaluate({"extra": e}) for e in wanted_by):
            continue
        name = canonicalize_name(requirement.name)
        wanted = {"", *requirement.extras}
        if wanted <= found.get(name, set()):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise CheckFailed(f"{name} (required) is not installed in {sys.prefix}") from None
        found.setdefault(name, set()).update(wanted)
        pending += [(Requirement(text), tuple(wanted)) for text in dist.requires or []]
    return set(found)


def link_closure(closure: set[str], shim: Path) -> int:
    """Link the closure's top-level files and folders into ``shim``; a folder other distributions also
    fill (``nvidia/``: torch's CUDA libraries beside DALI) is made, and only the closure's entries in it
    linked. Returns how many links were made."""
    site = Path(sysconfig.get_paths()["purelib"])
    owners: dict[tuple[str, ...], set[str]] = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        for file in dist.files or ():
            parts = Path(file).parts
            if parts and parts[0] not in ("..", "__pycache__"):  # compiled files are made again where needed
                for depth in (1, 2):
                    if len(parts) >= depth:
                        owners.setdefault(parts[:depth], set()).add(name)
    links = 0
    for prefix in sorted(p for p, who in owners.items() if len(p) == 1 and who & closure):
        if owners[prefix] <= closure:
            (shim / prefix[0]).symlink_to(site / prefix[0])
            links += 1
            continue
        (shim / prefix[0]).mkdir()
        for inner in sorted(p for p, who in owners.items() if len(p) == 2 and p[0] == prefix[0] and who & closure):
            if not owners[inner] <= closure:
                raise CheckFailed(f"{site / Path(*inner)} is shared by {sorted(owners[inner])}: cannot reuse it alone")
            (shim / Path(*inner)).symlink_to(site / Path(*inner))
            links += 1
    return links


def fresh_environment(wheel: Path, work: Path) -> Path:
    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    shim = work / "reused"
    shim.mkdir()
    closure = base_closure(wheel)
    links = link_closure(closure, shim)
    (site / "reused-base-requirements.pth").write_text(f"{shim}\n")
    # --no-index: every requirement must already be met by the reused copies; nothing is downloaded.
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--quiet", str(wheel)])
    print(f"install check: {len(closure)} base distributions reused ({links} links), none downloaded", flush=True)
    return venv


# ---- 4. from an empty folder

def user_environment(venv: Path) -> dict[str, str]:
    """The environment a user's shell gives: the venv first on PATH, nothing of the clone on the path."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               CUDA_VISIBLE_DEVICES="")
    return env


def readme_loop() -> str:
    """The README's first Python block: the loop a new user copies."""
    loop = next((body for lang, body in FENCE.findall((REPO / "README.md").read_text()) if lang == "python"), None)
    if loop is None:
        raise CheckFailed("README.md has no python block")
    return loop


def run_from_empty_folder(venv: Path, work: Path) -> None:
    folder = work / "user-project"
    folder.mkdir()
    env = user_environment(venv)

    def cli(*args: str) -> str:
        return run(["dali-bridge", *args], cwd=folder, env=env).stdout

    python = str(venv / "bin" / "python")
    where = run([python, "-c", "import dali_bridge, importlib.util; print(dali_bridge.__file__); "
                               "print(importlib.util.find_spec('nvidia.dali') is None)"], cwd=folder, env=env)
    module, no_dali = where.stdout.split()
    if not module.startswith(str(venv)) or no_dali != "True":
        raise CheckFailed(f"the fresh environment imports {module} (DALI absent: {no_dali}); expected the wheel's "
                          f"copy under {venv} and no DALI")
    version = cli("--version").split()[-1]
    expected = run([python, "-c", "import importlib.metadata as m; print(m.version('dali-bridge'))"], env=env)
    if version != expected.stdout.strip():
        raise CheckFailed(f"dali-bridge --version says {version}, the installed distribution {expected.stdout}")
    listed = cli("pipelines")
    names = sorted(path.stem for path in (REPO / "pipelines").glob("*.yaml"))
    if any(name not in listed for name in names):
        raise CheckFailed(f"dali-bridge pipelines does not list every shipped pipeline {names}:\n{listed}")
    cli("sample-data", "images", "--images", "24", "--classes", "3", "--seed", "0")
    # `dali-bridge run imagenet_train --data IMAGES --batches 2`, with every other shipped name beside it
    rows = work / "run.json"
    cli("run", *names, "--data", "images", "--batches", "2", "--set", "batch_size=8", "-q", "--json", str(rows))
    ran = [(row["pipeline"], row["backend"], row.get("batches")) for row in json.loads(rows.read_text())]
    if len(ran) != len(names) or any(backend != "torchvision" or batches != 2 for _, backend, batches in ran):
        raise CheckFailed(f"every shipped pipeline by name: expected 2 batches each on torchvision alone "
                          f"(auto without DALI), ran {ran}")
    shutil.copytree(folder / "images", folder / "data" / "train")
    loop = run([python, "-c", readme_loop()], cwd=folder, env=env).stdout.split()
    if loop[:1] != ["torchvision"]:
        raise CheckFailed(f"the README's loop printed {loop}; expected the torchvision backend first")
    leftovers = sorted(p.name for p in folder.iterdir() if p.name not in ("images", "data"))
    if leftovers:
        raise CheckFailed(f"running left files in the user's folder: {leftovers}")


def main() -> int:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dali-bridge-install-") as temp:
        work = Path(temp)
        resolution = None
        try:
            with step("sdist and wheel, and the wheel again from the sdist"):
                wheel = build_and_compare(work)
            resolution = Resolution(wheel, work)
            with step("a fresh environment outside the clone, the wheel installed"):
                venv = fresh_environment(wheel, work)
            with step("shipped pipelines by name and the README's loop, from an empty folder"):
                run_from_empty_folder(venv, work)
            resolution.check()
        except CheckFailed as exc:
            print(f"install check FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            if resolution is not None and resolution.process.poll() is None:
                resolution.process.kill()
                resolution.process.wait()
    print(f"install check: passed in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
