"""Ops from other packages: an installed distribution's ``dali_bridge.ops`` entry points register ops,
checked like the built-in ones, validated, shown (``show``, ``doctor``), documented and run like them.

Each test writes a real distribution (a module and its ``.dist-info`` with ``entry_points.txt``)
into a temporary folder on the path, where ``importlib.metadata`` finds it as it finds a
pip-installed one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from dali_bridge.ops.registry import BUILTIN_OPS, OpRegistrationError, entry_point_ops

# A random op as a user writes one outside dali-bridge: torchvision's RandomInvert.
INVERT_MODULE = '''
from dataclasses import dataclass

from dali_bridge.util.checks import probability_checker
from dali_bridge.ops.base import Op, Param
from dali_bridge.ops.facets import Display


@dataclass(frozen=True)
class Invert:
    apply: bool


class RandomInvert(Op, Display):  # no DALI fragment: torch runs it right after the DALI graph
    draws = 1
    transform = "RandomInvert"

    def sample(self, params, u, height, width):
        return (Invert(bool(u[0] < params["probability"])),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        return F.invert(image) if concrete[0].apply else image

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.RandomInvert(params["probability"])]

    def torchvision_stage(self, params):
        return "F.invert"


RANDOM_INVERT = RandomInvert(
    "random_invert", "pixel",
    (Param("probability", 0.5, probability_checker, "chance of inverting each image, in [0, 1] (default 0.5)"),),
    "Invert the colours with the given probability (torchvision's RandomInvert).", primary="probability")
NOT_AN_INSTANCE = RandomInvert
BAD_DEFAULT = RandomInvert(
    "bad_default", "pixel", (Param("probability", 2.0, probability_checker, "chance of inverting"),), "Inverts.")
'''
INVERT_ENTRY_POINT = "random_invert = invert_ops:RANDOM_INVERT"


def install(site: Path, distribution: str, entry_points: list[str], module: str = "invert_ops",
            source: str = INVERT_MODULE) -> Path:
    """Write ``distribution`` 1.0: ``module`` and its ``dali_bridge.ops`` entry points, into ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dali_bridge.ops]\n" + "\n".join(entry_points) + "\n")
    return site


@pytest.fixture(autouse=True)
def fresh_modules():
    """Each test's package is imported anew (its module source differs from test to test)."""
    yield
    for module in ("invert_ops", "other_ops"):
        sys.modules.pop(module, None)


def registered(monkeypatch, site: Path):
    monkeypatch.syspath_prepend(str(site))
    return entry_point_ops(BUILTIN_OPS)


def test_an_installed_distribution_registers_its_op_with_its_origin(monkeypatch, tmp_path):
    ops, origins = registered(monkeypatch, install(tmp_path / "site", "invert-ops", [INVERT_ENTRY_POINT]))
    assert list(ops) == ["random_invert"] and ops["random_invert"].transform == "RandomInvert"
    assert str(origins["random_invert"]) == ("package invert-ops 1.0 (entry point dali_bridge.ops: "
                                             "random_invert = invert_ops:RANDOM_INVERT)")


@pytest.mark.parametrize("entry_point, message", [
    ("resize = invert_ops:RANDOM_INVERT",
     "the entry point is named 'resize' but the op 'random_invert'; name the entry point after the op"),
    ("random_invert = invert_ops:NOT_AN_INSTANCE",
     "expected an instance of a dali_bridge.ops.base.Op subclass, found the class RandomInvert (point the entry point "
     "at an instance of it)"),
    ("bad_default = invert_ops:BAD_DEFAULT",
     "parameter 'probability': its default 2.0 fails its own check: expected a probability in [0, 1], found 2.0"),
    ("random_invert = invert_ops:MISSING", "cannot be loaded: AttributeError"),
    ("random_invert = no_such_module:RANDOM_INVERT", "cannot be loaded: ModuleNotFoundError"),
])
def test_a_broken_entry_point_is_refused_naming_the_distribution_and_entry_point(monkeypatch, tmp_path,
                                                                               entry_point, message):
    site = install(tmp_path / "site", "invert-ops", [entry_point])
    with pytest.raises(OpRegistrationError) as refused:
        registered(monkeypatch, site)
    text = str(refused.value)
    assert text.startswith(f"op from package invert-ops 1.0 (entry point dali_bridge.ops: {entry_point})")
    assert message in text and text.endswith("fix the package, or uninstall it (pip uninstall invert-ops)")


def test_an_op_named_like_a_built_in_is_refused(monkeypatch, tmp_path):
    source = INVERT_MODULE + '\nRESIZE = RandomInvert("resize", "pixel", RANDOM_INVERT.params, "Inverts.")\n'
    site = install(tmp_path / "site", "invert-ops", ["resize = invert_ops:RESIZE"], source=source)
    with pytest.raises(OpRegistrationError, match="'resize' is the name of a built-in op; give the op another name"):
        registered(monkeypatch, site)


def test_two_packages_registering_one_name_are_both_named(monkeypatch, tmp_path):
    install(tmp_path / "site", "invert-ops", [INVERT_ENTRY_POINT])
    install(tmp_path / "site", "other-ops", ["random_invert = other_ops:RANDOM_INVERT"], module="other_ops")
    with pytest.raises(OpRegistrationError) as refused:
        registered(monkeypatch, tmp_path / "site")
    assert "package invert-ops 1.0" in str(refused.value) and "package other-ops 1.0" in str(refused.value)
    assert "only one package may register a name" in str(refused.value)


def test_an_op_missing_what_its_backends_need_is_refused(monkeypatch, tmp_path):
    source = INVERT_MODULE + textwrap.dedent('''
        from dali_bridge.ops.dali_op import DaliOp

        class Half(DaliOp, RandomInvert):  # a DALI op: the DALI backends need its fragment
            pass
        HALF = Half("half", "pixel", RANDOM_INVERT.params, "Inverts.")
    ''')
    site = install(tmp_path / "site", "invert-ops", ["half = invert_ops:HALF"], source=source)
    with pytest.raises(OpRegistrationError, match="does not implement dali_graph "):
        registered(monkeypatch, site)


# One process with the distribution on its path, as after `pip install invert-ops`: the registry
# loads it at import, so every command sees the op.
END_TO_END = '''
import json, sys
import numpy as np
from dali_bridge.cli.main import main
from dali_bridge.loader.loader import build_loader
from dali_bridge.loader.select import available_backends
from dali_bridge.spec.reference import render_reference
from dali_bridge.spec.pipeline import spec_from_dict

root, good, bad = sys.argv[1:4]
out = {"validate_good": main(["validate", good]), "validate_bad": main(["validate", bad])}
main(["show", good])
from dali_bridge.tools.doctor import report
out["doctor"] = report()["ops_from_packages"]
out["reference"] = render_reference().split("### `random_invert`", 1)[1].split("###", 1)[0]
data = {"version": 1, "source": {"type": "folder", "root": root}, "batch_size": 4, "loader": {"workers": 0},
        "ops": [{"center_crop": 32}]}
plain = spec_from_dict(data)
inverted = spec_from_dict({**data, "ops": [{"center_crop": 32}, {"random_invert": 1.0}]})
out["inverted_is_255_minus_plain"] = {}
for backend in [b for b in ("torchvision", "dali-cpu") if b in available_backends()]:
    batches = []
    for spec in (plain, inverted):
        loader = build_loader(spec, backend)
        batches.append(next(iter(loader))[0].numpy().astype(int))
        loader.close()
    out["inverted_is_255_minus_plain"][backend] = bool(np.array_equal(batches[1], 255 - batches[0]))
print("RESULT " + json.dumps(out))
'''


@pytest.mark.slow
def test_an_installed_op_is_validated_shown_documented_and_run_like_a_built_in(tmp_path, sample_root,
                                                                                 write_pipeline):
    site = install(tmp_path / "site", "invert-ops", [INVERT_ENTRY_POINT])
    ops = [{"center_crop": 32}, {"random_invert": 0.25}]
    good = write_pipeline({"version": 1, "source": {"type": "folder", "root": str(sample_root)}, "batch_size": 4,
                           "ops": ops})
    bad = write_pipeline({"version": 1, "source": {"type": "folder", "root": str(sample_root)}, "batch_size": 4,
                          "ops": [{"center_crop": 32}, {"random_invert": {"probability": 2}}]})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", END_TO_END, str(sample_root), str(good), str(bad)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert (result["validate_good"], result["validate_bad"]) == (0, 2)
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), start=1) if "probability" in text)
    assert f"{bad}:{line}:" in done.stderr
    assert "ops[1].random_invert.probability: expected a probability in [0, 1], found 2" in done.stderr
    assert ("# ops[1] random_invert: from package invert-ops 1.0 (entry point dali_bridge.ops: "
            "random_invert = invert_ops:RANDOM_INVERT)") in done.stdout
    assert "F.invert" in done.stdout.split("## torchvision", 1)[1]
    assert result["doctor"] == ["random_invert: package invert-ops 1.0 (entry point dali_bridge.ops: "
                                "random_invert = invert_ops:RANDOM_INVERT)"]
    assert "Invert the colours with the given probability" in result["reference"]
    assert "From the package invert-ops 1.0" in result["reference"]
    assert result["inverted_is_255_minus_plain"].get("torchvision") is True
    assert all(result["inverted_is_255_minus_plain"].values()), result
