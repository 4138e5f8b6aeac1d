"""``benchmarks/device_check.sh``: its control flow, exercised on a CPU host by ``--dry-run``, so the
GPU check cannot rot while no GPU is around."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from tests.helpers.paths import REPO

SCRIPT = REPO / "benchmarks" / "device_check.sh"
NAMES = ["env", "data", "device", "equivalence", "errors", "sync", "pytest", "memory_bench"]
MAX_OUTPUT_FILES = 6   # what a device machine brings back: a few files, none deeper than two folders


def dry_run(out: Path, budget: int) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHON": sys.executable, "CHECK_BUDGET_S": str(budget),
           "CHECK_WORK": str(out.parent / "scratch")}
    env.pop("OUT", None)
    run = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], capture_output=True, text=True, env=env,
                         timeout=budget + 60)
    return run, json.loads((out / "device_check.json").read_text())


@pytest.mark.slow
def test_dry_run_runs_every_check_reports_the_gpu_ones_skipped_and_exits_0(tmp_path):
    run, report = dry_run(tmp_path / "out", budget=300)
    assert run.returncode == 0, run.stdout + run.stderr
    by_name = {check["name"]: check for check in report["checks"]}
    assert list(by_name) == NAMES and report["dry_run"] is True
    assert by_name["device"]["status"] == by_name["memory_bench"]["status"] == "skipped"
    assert by_name["device"]["reason"] == "dry run: no GPU used"
    ran = [name for name in NAMES if by_name[name]["status"] != "skipped"]
    assert all(by_name[name]["status"] == "passed" for name in ran), {n: by_name[n].get("reason") for n in ran}
    assert report["summary"] == {"passed": len(ran), "failed": 0, "skipped": len(NAMES) - len(ran)}
    if by_name["errors"]["status"] == "passed":   # raise yields the 2 batches before sample 9, skip keeps 23
        results = by_name["errors"]["results"]
        assert results["stand_in"] is True
        for executor in ("torchvision on cpu", "torchvision (threads) on cpu"):
            assert results[executor] == {"raise_yielded": 2, "skip_kept": 23, "skipped": [9],
                                         "all_bad_batch_skipped": [4, 5, 6, 7]}, executor
    # What comes back: a few files directly in the output folder; the scratch data went elsewhere.
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert 1 <= len(files) <= MAX_OUTPUT_FILES, files
    assert all(len(p.relative_to(tmp_path / "out").parts) <= 3 for p in files), files
    assert {p.name for p in files} <= set(load_module().OUTPUT_FILES)
    assert (tmp_path / "scratch" / "data").is_dir() and report["work"] == str(tmp_path / "scratch")
    # The printed tail is a one-screen summary: a line per check with its status, then the total.
    tail = run.stdout.strip().splitlines()[-(len(NAMES) + 2):]
    assert "device check summary" in tail[0]
    assert [line.split()[:2] for line in tail[1:-1]] == [[name, by_name[name]["status"]] for name in NAMES]
    assert tail[-1].startswith("device check: ") and tail[-1].endswith(str(tmp_path / "out" / "device_check.json"))
    assert all(len(line) <= 160 for line in tail)


def load_module():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "benchmarks" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checks_past_the_budget_are_skipped_and_said_so_and_limits_shrink_to_what_is_left(tmp_path, monkeypatch):
    module = load_module()
    clock = [0.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    limits = {}

    def fake_run(name, *args, timeout, **kwargs):
        limits[name] = timeout
        clock[0] += 40.0                                     # every check takes 40 s
        return {"seconds": 40.0, "status": "passed", "results": {}}

    monkeypatch.setattr(module, "run_in_process", fake_run)
    assert module.orchestrate(tmp_path / "out", budget=150, dry_run=False, images=4, data=None,
                              work=tmp_path / "work") == 0
    report = json.loads((tmp_path / "out" / "device_check.json").read_text())
    # env (expects 15 s), data (10), device (25) start; equivalence expects 50 s with 30 s left: not started,
    # while errors, which expects 30 s, still fits and runs
    assert [c["status"] for c in report["checks"]] == ["passed"] * 3 + ["skipped", "passed"] + ["skipped"] * 3
    assert report["checks"][3]["reason"] == "not run: expects ~50 s, 30 s of the 150 s budget left"
    assert limits == {"env": 60, "data": 60, "device": 60, "errors": 30}   # its own limit, or what is left


def test_the_plan_fits_install_and_checks_in_seven_minutes_and_is_printed_first(tmp_path, monkeypatch, capsys):
    module = load_module()
    total = sum(expected for _, _, expected, _ in module.CHECKS)
    assert total <= 0.95 * module.DEFAULT_BUDGET_S                 # inside the default budget
    assert total + module.INSTALL_EXPECTED_S <= module.PLAN_LIMIT_S == 420   # install + checks <= 7 minutes
    monkeypatch.setattr(module, "run_in_process", lambda name, *a, **k: {"seconds": 1.0, "status": "passed",
                                                                         "results": {}})
    module.orchestrate(tmp_path / "out", budget=1000, dry_run=True, images=4, data=None, work=tmp_path / "work")
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("device check plan, expected seconds on one H100") and f"= {total} s of checks" in first
    assert ", ".join(f"{name} {expected}" for name, _, expected, _ in module.CHECKS) in first
    report = json.loads((tmp_path / "out" / "device_check.json").read_text())
    assert report["plan"]["install_and_checks_s"] == total + module.INSTALL_EXPECTED_S


def test_the_header_docstring_and_docs_give_each_checks_expected_seconds_as_the_orchestrator_uses_them():
    module = load_module()
    listed = ", ".join(f"{name} {expected}" for name, _, expected, _ in module.CHECKS)
    total = sum(expected for _, _, expected, _ in module.CHECKS)
    assert f"#   {listed} ({total} in all)" in SCRIPT.read_text()
    for name, _, expected, _ in module.CHECKS:
        assert f"\n  {name:<12}{expected:>3} s  " in module.__doc__, name
    assert f"--- {total} s expected in all, inside the default budget of {module.DEFAULT_BUDGET_S} s" in module.__doc__
    gpu_md = (REPO / "docs" / "gpu.md").read_text()
    for name, _, expected, limit in module.CHECKS:
        assert f"| `{name}` | {expected} | {limit} |" in gpu_md, name
    minimum = " and ".join(f"{name} {'.'.join(map(str, version))}" for name, version in module.MINIMUM_VERSIONS.items())
    assert f"oldest pair the project runs on: {minimum}" in " ".join(gpu_md.split())
    assert f"{total} s of checks, {total + module.INSTALL_EXPECTED_S} s with the install" in gpu_md


def test_the_work_folder_must_lie_outside_the_output_folder(tmp_path):
    module = load_module()
    with pytest.raises(SystemExit, match="must be outside the output folder"):
        module.orchestrate(tmp_path, budget=10, dry_run=True, images=4, data=None, work=tmp_path / "work")


@pytest.mark.slow
def test_on_a_cuda_host_where_dali_cannot_run_the_dali_checks_fail_not_skip(tmp_path, monkeypatch):
    from dali_bridge.loader import select

    module = load_module()
    monkeypatch.setattr(module, "cuda_devices", lambda: 1)
    monkeypatch.setattr(select, "unavailable_reason", lambda backend, host=None: "DALI not installed (pip ...)")
    for name in ("device", "equivalence", "errors", "sync", "memory_bench"):
        result = module.run_one(name, tmp_path / "data", tmp_path, tmp_path, False, 4)
        assert result["status"] == "failed", (name, result)
        assert result["reason"] == "AssertionError: 1 CUDA device(s) here, but dali cannot run: DALI not installed " \
                                   "(pip ...)"
    monkeypatch.setattr(module, "cuda_devices", lambda: 0)   # no CUDA at all: nothing to prove, skipped
    assert module.run_one("device", tmp_path / "data", tmp_path, tmp_path, False, 4) == {
        "status": "skipped", "reason": "no CUDA device here"}


def test_the_memory_child_hands_its_result_over_in_a_file_not_on_stdout(tmp_path, monkeypatch, capsys):
    module = load_module()
    monkeypatch.setattr(module, "memory_of", lambda backend, data: print("a warning at exit") or {"backend": backend})
    assert module.main(["--memory-of", "dali", "--data", str(tmp_path), "--result", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text()) == {"backend": "dali"}


def test_exit_status_is_1_when_a_check_that_ran_failed(tmp_path, monkeypatch):
    module = load_module()
    outcomes = {"errors": {"status": "failed", "reason": "AssertionError: dali: yielded [] before the error"},
                "device": {"status": "skipped", "reason": "needs a CUDA device"}}
    monkeypatch.setattr(module, "run_in_process", lambda name, *a, **k: {"seconds": 0.0, **outcomes.get(
        name, {"status": "passed", "results": {}})})
    assert module.orchestrate(tmp_path / "out", budget=1000, dry_run=False, images=4, data=None,
                              work=tmp_path / "work") == 1
    report = json.loads((tmp_path / "out" / "device_check.json").read_text())
    assert report["summary"] == {"passed": 6, "failed": 1, "skipped": 1} and report["exit_status"] == 1
    monkeypatch.setattr(module, "run_in_process", lambda name, *a, **k: {"seconds": 0.0, "status": "skipped",
                                                                         "reason": "needs a CUDA device"})
    assert module.orchestrate(tmp_path / "out", budget=1000, dry_run=False, images=4, data=None,
                              work=tmp_path / "work") == 0


def test_the_bench_flags_the_check_uses_exist():
    text = subprocess.run([sys.executable, "-m", "dali_bridge", "bench", "--help"], capture_output=True,
                          text=True, cwd=REPO).stdout
    for flag in ("--data", "--backends", "--baselines", "--batches", "--warmup", "--repeat", "--json", "-q",
                 "--threads"):
        assert f"{flag} " in text or f"{flag}," in text, f"dali-bridge bench has no {flag}: device_check.py uses it"


def raised_in(*files: str) -> RuntimeError:
    """A sync-debug error raised through frames in ``files`` (outermost first)."""
    namespace: dict = {}
    exec(compile("def f0():\n    raise RuntimeError('called a synchronizing CUDA operation')\n", files[-1], "exec"),
         namespace)
    for depth, name in enumerate(reversed(files[:-1]), 1):
        exec(compile(f"def f{depth}():\n    f{depth - 1}()\n", name, "exec"), namespace)
    try:
        namespace[f"f{len(files) - 1}"]()
    except RuntimeError as exc:
        return exc
    raise AssertionError("nothing raised")


def test_the_sync_check_tells_torchvisions_kernels_from_the_bridges_code():
    module = load_module()
    in_torchvision = module.sync_site(raised_in("/repo/dali_bridge/ops/auto_augment.py",
                                                "/site/torchvision/transforms/v2/functional/_geometry.py",
                                                "/site/torch/_tensor.py"))
    assert in_torchvision["in"] == "torchvision's kernels" and in_torchvision["bridge_frame"] == "auto_augment.py:2"
    # the bridge's own torchvision backend module is the bridge's code, not torchvision's package
    ours = module.sync_site(raised_in("/repo/dali_bridge/backends/torchvision.py", "/site/torch/_tensor.py"))
    assert ours["in"] == "the bridge's code" and ours["bridge_frame"] == "torchvision.py:2"
    assert ours["message"] == "called a synchronizing CUDA operation"


def raised_through(*frames: tuple[str, str]) -> RuntimeError:
    """A sync-debug error raised through functions ``(file, name)`` (outermost first)."""
    namespace: dict = {}
    inner = "raise RuntimeError('called a synchronizing CUDA operation')"
    for file, name in reversed(frames):
        exec(compile(f"def {name}():\n    {inner}\n", file, "exec"), namespace)
        inner = f"{name}()"
    try:
        namespace[frames[0][1]]()
    except RuntimeError as exc:
        return exc
    raise AssertionError("nothing raised")


def test_the_sync_check_accepts_a_host_tails_copy_to_the_host_and_only_that():
    from dali_bridge.backends import device

    module = load_module()
    copy = (("/repo/dali_bridge/backends/dali/tail_runner.py", "_tail_inputs"),
            (device.__file__, "copy_batch_to_host"), ("/site/torch/_tensor.py", "to"))
    assert module.sync_site(raised_through(*copy), host_tail=True)["in"] == module.HOST_TAIL_COPY
    assert module.HOST_TAIL_COPY in module.ALLOWED_SYNCS
    # The same copy where the tail runs on the GPU, or another sync of the host tail's: the bridge's code.
    assert module.sync_site(raised_through(*copy), host_tail=False)["in"] == "the bridge's code"
    finish = (("/repo/dali_bridge/backends/dali/tail_runner.py", "run"),
              ("/repo/dali_bridge/backends/finishing.py", "finish_batch"))
    assert module.sync_site(raised_through(*finish), host_tail=True)["in"] == "the bridge's code"
    # A function of that name elsewhere is not the copy: the rule reads the function's own file.
    elsewhere = (("/repo/dali_bridge/backends/dali/tail_runner.py", "copy_batch_to_host"),
                 ("/site/torch/_tensor.py", "to"))
    assert module.sync_site(raised_through(*elsewhere), host_tail=True)["in"] == "the bridge's code"


class CopyRecorded(Exception):
    """Raised by :class:`RecordingCudaTensor` once it recorded the stack of its copy."""


class RecordingCudaTensor(torch.Tensor):
    """A CPU tensor that says it is on cuda:0; its copy elsewhere (``to``) records the Python stack, as
    torch's sync debug mode sees it under "warn", then either raises :class:`CopyRecorded` (``stop``) or
    returns the plain tensor."""
    stacks: list = []
    stop = True

    @property
    def device(self):
        return torch.device("cuda", 0)

    def to(self, *args, **kwargs):
        RecordingCudaTensor.stacks.append(traceback.extract_stack()[:-1])
        if RecordingCudaTensor.stop:
            raise CopyRecorded
        return torch.Tensor.to(self.as_subclass(torch.Tensor), *args, **kwargs)


class GraphOutput:
    """DALI's uint8 HWC output as the tail reads it: one tensor (``dense``), or one per image."""

    def __init__(self, images: list[torch.Tensor], dense: bool):
        self.images, self.dense = images, dense

    def is_dense_tensor(self) -> bool:
        return self.dense

    def as_tensor(self) -> torch.Tensor:
        return torch.stack(self.images).as_subclass(RecordingCudaTensor)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, n: int) -> torch.Tensor:
        return self.images[n].as_subclass(RecordingCudaTensor)


def host_tail_executor(root: Path, monkeypatch):
    """timm_train's DALI executor built for a GPU (faked: one CUDA device, streams that do nothing), its
    tail on the host (a PIL kernel), reading graph outputs through ``torch.from_dlpack`` unchanged."""
    import contextlib

    from dali_bridge.backends.base import Topology
    from dali_bridge.backends.dali.executor import DaliExecutor
    from dali_bridge.data.sources.local import list_source
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.spec.pipeline import coerce_spec
    from tests.helpers.hostile import write_image_folder

    write_image_folder(root, classes=2, per_class=2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: f"side stream of {device}")
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch, "from_dlpack", lambda tensor: tensor)
    spec = coerce_spec(REPO / "pipelines" / "timm_train.yaml", {"source": {"type": "folder", "root": str(root)}})
    executor = DaliExecutor(spec, list_source(spec.source), build_plan(spec), gpu=True, topology=Topology(0, 1, 0))
    assert executor.tail.device == torch.device("cpu") and executor.tail.side_stream is not None
    return executor


@pytest.mark.parametrize("dense", [True, False], ids=["one-size", "per-image"])
def test_host_tail_copy_recognised_from_real_call(tmp_path, monkeypatch, dense):
    from dali_bridge.backends.device import copy_batch_to_host

    module = load_module()
    executor = host_tail_executor(tmp_path / "data", monkeypatch)
    images = [torch.zeros(8 + n * (not dense), 8, 3, dtype=torch.uint8) for n in range(3)]
    monkeypatch.setattr(RecordingCudaTensor, "stacks", [])
    with pytest.raises(CopyRecorded):   # the tail's real path, from the executor's hand-over to the copy
        executor.tail.finished([GraphOutput(images, dense)], [[] for _ in images], None)
    (stack,) = RecordingCudaTensor.stacks
    ours = [frame for frame in stack if "dali_bridge" in Path(frame.filename).parts]
    assert ours[-1].name == copy_batch_to_host.__name__ and ours[0].name == "finished", [f.name for f in ours]
    assert module.frame_site(stack, module.SYNC_MESSAGE, host_tail=True)["in"] == module.HOST_TAIL_COPY
    assert module.frame_site(stack, module.SYNC_MESSAGE, host_tail=False)["in"] == "the bridge's code"


@pytest.mark.parametrize("dense", [True, False], ids=["one-size", "per-image"])
def test_a_host_tail_copies_its_batch_to_the_host_once_in_both_branches(tmp_path, monkeypatch, dense):
    executor = host_tail_executor(tmp_path / "data", monkeypatch)
    generator = torch.Generator().manual_seed(3)
    images = [torch.randint(0, 256, (8 + n * (not dense), 9, 3), dtype=torch.uint8, generator=generator)
              for n in range(4)]
    monkeypatch.setattr(RecordingCudaTensor, "stacks", [])
    monkeypatch.setattr(RecordingCudaTensor, "stop", False)
    inputs = executor.tail._tail_inputs([GraphOutput(images, dense)])
    assert len(RecordingCudaTensor.stacks) == 1   # one copy (one host wait) per batch, whatever the batch holds
    on_host = list(inputs) if dense else inputs
    assert all(type(image) is torch.Tensor and image.device.type == "cpu" for image in on_host)
    assert all(torch.equal(image, source.permute(2, 0, 1)) for image, source in zip(on_host, images))


def test_a_pytest_selection_that_selects_nothing_fails_the_check_loudly(tmp_path, monkeypatch):
    module = load_module()
    monkeypatch.setattr(module, "PYTEST_SELECTIONS", ("tests/backends/test_gone.py",))
    with pytest.raises(AssertionError, match=r"test files not found: \['tests/backends/test_gone.py'\]"):
        module.check_pytest(tmp_path, tmp_path, tmp_path, True)
    monkeypatch.setattr(module, "PYTEST_SELECTIONS", ("tests/backends/dali/test_gpu_tail.py::test_renamed_away",))
    with pytest.raises(AssertionError, match="pytest failed"):   # pytest itself refuses a test it cannot find
        module.check_pytest(tmp_path, tmp_path, tmp_path, True)
    node = "tests/backends/dali/test_batched_tail.py::test_the_probe_answers_what_the_devices_add_kernel_does"
    assert module.selects(node, node + "[cpu]") and module.selects("tests/backends/dali/test_gpu.py",
                                                                   "tests/backends/dali/test_gpu.py::test_x")
    assert not module.selects(node, node + "_too[cpu]") and not module.selects("tests/backends/dali/test_gpu.py",
                                                                               "tests/backends/test_gpu.py_x::t")
    assert module.junit_node_ids(junit(tmp_path / "r.xml", "tests.backends.dali.test_gpu", "test_x[a]")) == [
        "tests/backends/dali/test_gpu.py::test_x[a]"]


def junit(path: Path, classname: str, name: str) -> Path:
    path.write_text(f'<testsuites><testsuite><testcase classname="{classname}" name="{name}"/></testsuite>'
                    f'</testsuites>')
    return path


def test_every_pytest_selection_of_the_check_selects_a_test_here(tmp_path):
    module = load_module()
    found = module.check_pytest(tmp_path, tmp_path, tmp_path, True)   # a dry run: collected only
    assert set(found["selected"]) == set(module.PYTEST_SELECTIONS) and all(found["selected"].values()), found


def warning_through(*frames: tuple[str, str]):
    """A function that, through functions ``(file, name)`` (outermost first), warns as torch's sync
    debug mode does under "warn"; then returns."""
    namespace: dict = {"warnings": __import__("warnings")}
    inner = "warnings.warn('called a synchronizing CUDA operation')"
    for file, name in reversed(frames):
        exec(compile(f"def {name}():\n    {inner}\n", file, "exec"), namespace)
        inner = f"{name}()"
    return namespace[frames[0][1]]


def test_warn_mode_lists_every_sync_of_a_batch_where_it_happened(monkeypatch):
    import torch

    module = load_module()
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    affine = warning_through(("/repo/dali_bridge/ops/policy_kernels.py", "affine_operations"),
                             ("/site/torchvision/transforms/v2/functional/_geometry.py", "_apply_grid_transform"))
    ours = warning_through(("/repo/dali_bridge/ops/batched.py", "blend"), ("/site/torch/_tensor.py", "item"))

    def batch():
        affine(), ours(), affine()   # the first sync is torchvision's: "error" mode would stop there
        import warnings
        warnings.warn("something else")   # other warnings are shown as ever

    with pytest.warns(UserWarning, match="something else"):
        stacks = module.warned_syncs(batch, debug=True)
    assert modes == ["warn", 0]
    sites = [module.frame_site(stack, module.SYNC_MESSAGE)["in"] for stack in stacks]
    assert sites == ["torchvision's kernels", "the bridge's code", "torchvision's kernels"]
    assert module.frame_site(stacks[1], module.SYNC_MESSAGE)["bridge_frame"] == "batched.py:2"
    with pytest.warns(UserWarning, match="something else"):
        module.warned_syncs(batch, debug=False)
    assert modes == ["warn", 0]   # no mode set in a dry run


def test_the_pytest_check_names_failures_and_errors_in_the_summary_that_comes_back(tmp_path, monkeypatch):
    module = load_module()
    commands = []

    def failing_run(command, result, **kwargs):
        commands.append(command)
        summary = "FAILED tests/backends/dali/test_gpu.py::test_x - AssertionError\n1 failed, 3 passed in 9.0s"
        return {"returncode": 1, "timed_out": False, "teardown_hang_s": None, "output": summary}

    monkeypatch.setattr(module, "run_for_result", failing_run)
    with pytest.raises(AssertionError, match="FAILED tests/backends/dali/test_gpu.py::test_x"):
        module.check_pytest(tmp_path, tmp_path, tmp_path, False)
    (command,) = commands
    assert "-rfEs" in command and "-rs" not in command


def test_pytest_hanging_at_exit_after_its_xml_is_judged_by_the_xml_and_reported(tmp_path, monkeypatch):
    module = load_module()

    def hanging_run(command, result, **kwargs):
        junit(result, "tests.backends.dali.test_gpu", "test_x")
        return {"returncode": None, "timed_out": False, "teardown_hang_s": 20.0, "output": "4 passed in 9.0s"}

    monkeypatch.setattr(module, "run_for_result", hanging_run)
    monkeypatch.setattr(module, "PYTEST_SELECTIONS", ("tests/backends/dali/test_gpu.py",))
    found = module.check_pytest(tmp_path, tmp_path, tmp_path, False)
    assert found["teardown"].startswith("pytest hung at interpreter exit") and found["summary"] == "4 passed in 9.0s"


def test_a_hang_at_interpreter_exit_is_reported_apart_from_the_result_that_stands(tmp_path, monkeypatch):
    module = load_module()
    result = tmp_path / "check.json"
    # Writes its result, then hangs (as a thread that never ends would keep the interpreter from exiting).
    script = (f"import json, os, time; p = {str(result)!r}; open(p + '.partial', 'w').write(json.dumps("
              f"{{'status': 'passed', 'results': {{}}}})); os.replace(p + '.partial', p); time.sleep(60)")
    started = time.monotonic()
    ran = module.run_for_result([sys.executable, "-c", script], result, timeout=30, log=tmp_path / "log", grace=0.5)
    assert time.monotonic() - started < 20 and ran["teardown_hang_s"] is not None and not ran["timed_out"]
    # In the orchestrator: the check passed, the hang is said beside it, the exit status is the results'.
    monkeypatch.setattr(module, "run_in_process", lambda name, *a, **k: {"seconds": 1.0, "status": "passed",
                        "results": {}, **({"teardown": "hung at exit"} if name == "sync" else {})})
    assert module.orchestrate(tmp_path / "out", budget=1000, dry_run=False, images=4, data=None,
                              work=tmp_path / "work") == 0
    report = json.loads((tmp_path / "out" / "device_check.json").read_text())
    assert report["teardown_hangs"] == ["sync"] and report["summary"]["failed"] == 0
    # A process that writes nothing within its limit still fails the check, as timed out.
    quiet = module.run_for_result([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "none.json",
                                  timeout=1, log=tmp_path / "log2", grace=0.5)
    assert quiet["timed_out"] and quiet["teardown_hang_s"] is None


def test_the_env_check_records_torch_and_torchvision_and_stops_the_run_below_the_minimum(tmp_path, monkeypatch):
    import torchvision

    module = load_module()
    monkeypatch.setattr(module, "check_env_doctor", lambda: "doctor")
    found = module.run_one("env", tmp_path, tmp_path, tmp_path, True, 4)
    assert found["status"] == "passed"
    assert (found["results"]["torch"], found["results"]["torchvision"]) == (torch.__version__, torchvision.__version__)
    monkeypatch.setattr(torch, "__version__", "2.1.2+cu121")
    monkeypatch.setattr(torchvision, "__version__", "0.16.2+cu121")
    found = module.run_one("env", tmp_path, tmp_path, tmp_path, True, 4)
    assert found["status"] == "failed" and found["stops_run"] is True
    assert "torch 2.1.2+cu121 (the project needs 2.6 or newer) and torchvision 0.16.2+cu121 (the project needs " \
           "0.21 or newer)" in found["reason"]
    assert found["results"]["torchvision"] == "0.16.2+cu121"
    # The orchestrator then runs nothing more, and says why for each check it left out.
    monkeypatch.setattr(module, "run_in_process", lambda name, *a, **k: {"seconds": 0.0, **(
        found if name == "env" else {"status": "passed", "results": {}})})
    assert module.orchestrate(tmp_path / "out", budget=1000, dry_run=False, images=4, data=None,
                              work=tmp_path / "work") == 1
    report = json.loads((tmp_path / "out" / "device_check.json").read_text())
    assert [c["status"] for c in report["checks"]] == ["failed"] + ["skipped"] * (len(NAMES) - 1)
    assert report["checks"][1]["reason"].startswith("not run: env failed (StopRun: this machine's torch 2.1.2")


def test_the_equivalence_check_judges_each_variant_by_the_one_table_of_bounds():
    from dali_bridge.tools.compare_bounds import DECODE_BOUNDS

    module = load_module()
    mixed, cpu = DECODE_BOUNDS["mixed"], DECODE_BOUNDS["cpu"]
    within = {"max_levels": mixed.max_abs, "mean_levels": mixed.mean_abs}
    assert module.equivalence_failures("train-mixed", "mixed", within) == []
    assert within["bound"] == f"max <= {mixed.max_abs:g}, mean <= {mixed.mean_abs:g} levels"
    # The maximum of mixed decode is bounded too, and decode.device cpu has its own, tighter, row.
    assert module.equivalence_failures("val-mixed", "mixed", {"max_levels": mixed.max_abs + 1, "mean_levels": 0.1}) \
        == [f"val-mixed: max {mixed.max_abs + 1:g} levels > {mixed.max_abs:g}"]
    assert module.equivalence_failures("val-cpu-decode", "cpu", {"max_levels": 1, "mean_levels": cpu.mean_abs + 0.1}) \
        == [f"val-cpu-decode: mean {cpu.mean_abs + 0.1:.3f} levels > {cpu.mean_abs:g}"]


def test_the_device_checks_minimum_versions_are_the_packages_declared_minimum():
    # The env check stops a GPU run below these; pip must refuse the same versions on install.
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, version in load_module().MINIMUM_VERSIONS.items():
        assert any(req.split(",")[0].replace(" ", "") == f"{name}>={'.'.join(map(str, version))}"
                   for req in declared), (name, declared)
