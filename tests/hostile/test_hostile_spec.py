"""Hostile pipeline files: each ends in a SpecError (exit 2 from the CLI) in bounded time and memory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.backends import HOST_BACKENDS
from tests.helpers.paths import REPO, VAL
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID
from dali_bridge.loader.limits import HostLimits, largest_sample_image, loader_limit_problems
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.overrides import parse_override
from dali_bridge.spec.pipeline import PipelineSpec, load_spec, spec_from_dict
from dali_bridge.spec.problems import SpecError
from dali_bridge.spec.reading import ALIAS_NODE_BUDGET, MAX_NESTING

BASE = "version: 1\nsource: {type: folder, root: /nonexistent}\nbatch_size: 4\nops: [center_crop: 8]\n"

# Child processes import this checkout's package.
_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _write(tmp_path: Path, body: str | bytes, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("body, where", [
    (BASE.encode() + b"name: caf\xe9\n", ":5:10"),                     # Latin-1
    (b"# \xff\xfe comment\n" + BASE.encode(), ":1:3"),                  # stray bytes in a comment
    (BASE.encode("utf-16"), ":1:1"),                                   # UTF-16 with its BOM
])
def test_a_pipeline_that_is_not_utf8_names_the_line_and_column(tmp_path, body, where):
    path = _write(tmp_path, body)
    problems = _problems(path)
    assert len(problems) == 1 and f"{path}{where}" in problems[0] and "not UTF-8" in problems[0]


def _nested(depth: int, style: str) -> str:
    if style == "flow-list":
        return "x: " + "[" * depth + "]" * depth + "\n"
    if style == "flow-map":
        return "x: " + "{a: " * depth + "1" + "}" * depth + "\n"
    return "x:\n" + "".join("  " * (level + 1) + "a:\n" for level in range(depth)) + "  " * (depth + 1) + "1\n"


@pytest.mark.parametrize("style", ["flow-list", "flow-map", "block-map"])
def test_deep_nesting_is_refused_with_the_bound(tmp_path, style):
    problems = _problems(_write(tmp_path, BASE + _nested(5000 if style != "block-map" else 500, style)))
    assert len(problems) == 1 and f"nested more than {MAX_NESTING} levels" in problems[0]


def test_nesting_within_the_bound_reaches_the_validator(tmp_path):
    problems = _problems(_write(tmp_path, BASE + _nested(MAX_NESTING - 2, "flow-list")))
    assert len(problems) == 1 and "unknown key 'x'" in problems[0]


def _laughs(levels: int, fan: int, merge: bool = False) -> str:
    text = "a0: &a0 [" + ",".join(["lol"] * fan) + "]\n"
    for level in range(1, levels):
        if merge:
            keys = ", ".join(f"k{i}: *a{level - 1}" for i in range(fan))
            text += f"a{level}: &a{level} {{{keys}}}\n"
        else:
            text += f"a{level}: &a{level} [" + ",".join([f"*a{level - 1}"] * fan) + "]\n"
    return text + f"name: *a{levels - 1}\n"


@pytest.mark.parametrize("body", [
    _laughs(9, 9),                      # lists: 9^9 values from ~500 bytes
    _laughs(12, 4, merge=True),         # mappings
    "a: &a {x: 1}\n" + "".join(f"b{i}: {{<<: *a, y: *a}}\n" for i in range(6000)),  # many cheap aliases add up
])
def test_alias_expansion_beyond_the_budget_is_refused(tmp_path, body):
    path = _write(tmp_path, BASE + body)
    problems = _problems(path)
    assert len(problems) == 1 and f"more than {ALIAS_NODE_BUDGET} values" in problems[0]
    assert f"{path}:" in problems[0]


@pytest.mark.parametrize("body", ["a: &a [1, *a]\n", "a: &a {b: {c: *a}}\n"])
def test_a_recursive_alias_is_refused(tmp_path, body):
    problems = _problems(_write(tmp_path, BASE + body))
    assert len(problems) == 1 and "refers to its own anchor" in problems[0]


def test_small_aliases_keep_working(tmp_path):
    body = ("version: 1\nsource: {type: folder, root: /x}\nbatch_size: 4\nseed: &n 3\n"
            "ops:\n  - center_crop: 8\n  - normalize: {mean: &m [0.5, 0.5, 0.5], std: *m}\n"
            "loader: {prefetch: *n}\n")
    spec = load_spec(_write(tmp_path, body))
    assert spec.loader.prefetch == 3 and spec.ops[1]["std"] == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("body", [
    "name: [" + ",".join(["x" * 50] * 20_000) + "]\n",      # a long list
    "batch_size: '" + "9" * 200_000 + "'\n",                  # a long string
    "ops: [{center_crop: 8, " + "k" * 100_000 + ": 1}]\n",    # a long key
    "ops: [{center_crop: '" + "x" * 100_000 + "'}]\n",       # a long value an op's own check quotes
])
@pytest.mark.slow
def test_messages_quote_values_shortened(tmp_path, body):
    text = BASE.replace("batch_size: 4\n", "").replace("ops: [center_crop: 8]\n", "") + body
    if "batch_size" not in body:
        text += "batch_size: 4\n"
    if "ops:" not in body:
        text += "ops: [center_crop: 8]\n"
    problems = _problems(_write(tmp_path, text))
    assert problems and all(len(p) < 800 for p in problems)  # the message itself at most 600


@pytest.mark.parametrize("name_yaml", ['"\\ud800"', '"ok\\udfff"', '"\\udcff tail"'])
def test_a_lone_surrogate_in_the_name_is_a_problem(tmp_path, name_yaml):
    problems = _problems(_write(tmp_path, BASE + f"name: {name_yaml}\n"))
    assert len(problems) == 1 and "name" in problems[0] and "lone surrogate" in problems[0]


def test_a_lone_surrogate_in_a_path_or_override_is_a_problem(tmp_path):
    path = _write(tmp_path, BASE.replace("/nonexistent", '"/data/\\ud800"'))
    assert "source.root" in _problems(path)[0]
    with pytest.raises(SpecError, match="lone surrogate"):
        load_spec(_write(tmp_path, BASE, "q.yaml"), ['name="\\ud800"'])
    with pytest.raises(SpecError, match="--set name=.*unacceptable character"):  # argv bytes that are not UTF-8
        parse_override("name=\udcff")


@pytest.mark.parametrize("body", [
    BASE.encode() + b"name: caf\xe9\n",
    (BASE + 'name: "\\ud800"\n').encode(),
    (BASE + _nested(3000, "flow-list")).encode(),
    (BASE + _laughs(9, 9)).encode(),
])
def test_cli_validate_exits_2_with_a_message_not_a_traceback(tmp_path, capsys, body):
    path = _write(tmp_path, body)
    assert main(["validate", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert str(path) in err and "Traceback" not in err


@pytest.mark.slow
def test_the_billion_laughs_file_validates_in_bounded_memory(tmp_path):
    """A child process with a 1 GiB address-space cap: unbounded expansion would die of MemoryError."""
    path = _write(tmp_path, BASE + _laughs(10, 10))
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
            "from dali_bridge.cli.main import main; sys.exit(main(['validate', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=120, env=_ENV)
    assert done.returncode == EXIT_INVALID and "more than" in done.stderr, done.stderr[-2000:]


# ---- loader settings against the host

SMALL_HOST = HostLimits(cores=2, open_files=1024, memory_available=8 << 30)


def _spec(**loader) -> PipelineSpec:
    return spec_from_dict({"version": 1, "batch_size": 64, "ops": [{"center_crop": 224}],
                           "source": {"type": "folder", "root": "/x"}, "loader": loader}, origin="p.yaml")


@pytest.mark.parametrize("loader, backend, key, bound", [
    ({"workers": 40000}, "dali-cpu", "loader.workers", "at most 32"),
    ({"workers": 40000}, "torchvision", "loader.workers", "at most 32"),
    ({"workers": 33}, "dali-cpu", "loader.workers", "at most 32"),
    ({"workers": 30, "prefetch": 200}, "torchvision", "loader", "limit of 1024 (ulimit -n)"),
    ({"workers": 2, "prefetch": 20000}, "dali-cpu", "loader.prefetch", "memory available"),
    ({"workers": 2, "prefetch": 20000}, "torchvision", "loader.prefetch", "memory available"),
    ({"workers": 1, "prefetch": 10**11}, "dali-cpu", "loader.prefetch", "memory available"),
])
def test_loader_settings_beyond_the_host_name_the_key_and_the_bound(loader, backend, key, bound):
    spec = _spec(**loader)
    problems = loader_limit_problems(spec, build_plan(spec), backend=backend, host=SMALL_HOST)
    assert any(p.path == key and bound in p.message for p in problems), problems


@pytest.mark.parametrize("loader", [{}, {"workers": 16, "prefetch": 4}, {"workers": 0, "prefetch": 8}])
def test_ordinary_loader_settings_fit_a_small_host(loader):
    spec = _spec(**loader)
    for backend in ("dali-cpu", "torchvision"):
        assert loader_limit_problems(spec, build_plan(spec), backend=backend, host=SMALL_HOST) == []


def _large_on_the_way(batch_size: int = 256, **loader) -> PipelineSpec:
    """A 64x64 output made from 16384x16384 images: 768 MiB per sample before the crop."""
    return spec_from_dict({"version": 1, "batch_size": batch_size, "ops": [{"resize": [16384, 16384]},
                                                                            {"center_crop": 64}],
                           "source": {"type": "folder", "root": "/x"}, "loader": loader}, origin="p.yaml")


@pytest.mark.parametrize("backend, loader, held", [
    ("dali-cpu", {"workers": 2}, "3 batches of 256 in flight (prefetch 2 + 1) need 576.0 GiB"),
    ("torchvision", {"workers": 16}, "16 worker(s) holding one each, with their batch buffers, need 12.2 GiB"),
])
def test_the_memory_check_sizes_the_images_on_the_way_not_only_the_output(backend, loader, held):
    spec = _large_on_the_way(**loader)
    problems = loader_limit_problems(spec, build_plan(spec), backend=backend, host=SMALL_HOST)
    assert [p.path for p in problems] == ["ops[0].resize"], problems
    assert "makes images of 768.0 MiB each" in problems[0].message and held in problems[0].message
    assert "crop before a large resize" in problems[0].message


def test_torchvision_workers_hold_one_large_image_each_not_a_batch():
    spec = _large_on_the_way(workers=2)  # 2 x 768 MiB fits half of 8 GiB: each worker resizes one sample at a time
    assert loader_limit_problems(spec, build_plan(spec), backend="torchvision", host=SMALL_HOST) == []


def test_a_shorter_side_resize_is_sized_by_its_max_size():
    spec = spec_from_dict({"version": 1, "batch_size": 64, "ops": [{"resize": {"size": 8192, "max_size": 16384}},
                                                                   {"center_crop": 64}],
                           "source": {"type": "folder", "root": "/x"}}, origin="p.yaml")
    assert largest_sample_image(build_plan(spec)) == (3 * 8192 * 16384, 0)
    problems = loader_limit_problems(spec, build_plan(spec), backend="dali-cpu", host=SMALL_HOST)
    assert [p.path for p in problems] == ["ops[0].resize"]


@pytest.mark.parametrize("batch_size, loader", [(10 ** 600, {}), (4, {"prefetch": 10 ** 600}),
                                               (10 ** 5000, {"prefetch": 10 ** 5000, "workers": 10 ** 5000})],
                         ids=["batch_size", "prefetch", "all-past-str"])
@pytest.mark.parametrize("backend", ["dali-cpu", "torchvision"])
def test_integers_too_large_for_a_float_or_a_string_are_problems_not_tracebacks(batch_size, loader, backend):
    spec = spec_from_dict({"version": 1, "batch_size": batch_size, "ops": [{"center_crop": 224}],
                           "source": {"type": "folder", "root": "/x"}, "loader": loader}, origin="p.yaml")
    problems = loader_limit_problems(spec, build_plan(spec), backend=backend, host=SMALL_HOST)
    memory = [p for p in problems if p.path == "loader.prefetch"]
    assert len(memory) == 1 and "more than 1024 PiB" in memory[0].message and len(memory[0].message) < 600


_RLIMIT_CHILD = """
import resource, sys
import dali_bridge.backends.base  # torch: imported before the limit, as a training script would have
from dali_bridge.loader.limits import host_limits, loader_limit_problems
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import spec_from_dict

name, used_key = sys.argv[1], sys.argv[2]
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
used = int(status[used_key].split()[0]) * 1024
limit = getattr(resource, name)
resource.setrlimit(limit, (used + (512 << 20), resource.getrlimit(limit)[1]))
host = host_limits()
print(host.memory_bound, host.memory_available <= 512 << 20)
spec = spec_from_dict({"version": 1, "batch_size": 256, "ops": [{"center_crop": 224}, "normalize"],
                       "source": {"type": "folder", "root": "/x"}, "loader": {"prefetch": 2}}, origin="p.yaml")
for problem in loader_limit_problems(spec, build_plan(spec), backend="dali-cpu", host=host):
    print(problem.path, problem.message)
"""


@pytest.mark.parametrize("limit, used_key, shell", [("RLIMIT_AS", "VmSize", "ulimit -v"),
                                                    ("RLIMIT_DATA", "VmData", "ulimit -d")])
@pytest.mark.slow
def test_the_memory_check_honours_the_process_memory_limits(limit, used_key, shell):
    # 3 batches of 256 x 3 x 224 x 224 float32 (462 MiB) fit this host, not 512 MiB of headroom.
    done = subprocess.run([sys.executable, "-c", _RLIMIT_CHILD, limit, used_key], capture_output=True, text=True,
                          timeout=120, env=_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"{limit} ({shell}) headroom True", lines
    assert len(lines) == 2 and lines[1].startswith("loader.prefetch ") and f"of {limit} ({shell}) headroom" in lines[1]


@pytest.mark.parametrize("setting", ["loader.workers=40000", "loader.prefetch=20000", "loader.prefetch=1e11",
                                     "loader.prefetch=100000000000"])
@pytest.mark.parametrize("backend", ["torchvision", "dali-cpu"])
def test_run_refuses_absurd_loader_values_with_exit_2_before_starting(capsys, sample_root, setting, backend):
    if backend not in HOST_BACKENDS:
        pytest.skip(f"{backend} is not available here")
    code = main(["run", str(VAL), "--data", str(sample_root), "--backends", backend, "--set", setting, "-q"])
    err = capsys.readouterr().err
    assert code == EXIT_INVALID and "loader" in err and "Traceback" not in err


# ---- sample-data arguments


@pytest.mark.parametrize("args, message", [
    (["--classes", "0"], "classes (--classes) must be >= 1, got 0"),
    (["--classes", "-3"], "classes (--classes) must be >= 1, got -3"),
    (["--images", "0"], "images (0, --images) must be >= classes (10)"),
    (["--images", "5", "--classes", "6"], "images (5, --images) must be >= classes (6)"),
    (["--seed", "-1"], "seed (--seed) must be non-negative"),
])
def test_sample_data_with_impossible_counts_exits_2_with_the_reason(tmp_path, capsys, args, message):
    assert main(["sample-data", str(tmp_path / "set"), *args]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "set").exists()


def test_sample_data_into_a_file_or_a_foreign_folder_exits_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "mine.txt").write_text("x")
    assert main(["sample-data", str(tmp_path / "file")]) == EXIT_INVALID
    assert main(["sample-data", str(tmp_path / "folder")]) == EXIT_INVALID
    assert (tmp_path / "folder" / "mine.txt").read_text() == "x"
