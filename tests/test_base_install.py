"""The base install (no extra) runs the shipped pipelines: no module on the local path imports an
extra's client (aiohttp and its yarl, fsspec, s3fs, gcsfs, pyarrow, lightning, DALI) at import time."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.helpers.paths import REPO

# Packages only an extra brings (or that DALI's builds bring): blocked as if never installed.
EXTRAS_ONLY = ("aiohttp", "yarl", "fsspec", "s3fs", "gcsfs", "botocore", "aiobotocore", "pyarrow", "lightning",
               "nvidia.dali", "obstore", "spdl")


def test_the_readmes_first_command_runs_without_any_extras_client(tmp_path, sample_root):
    script = textwrap.dedent(f"""
        import sys
        BLOCKED = {EXTRAS_ONLY!r}

        class Absent:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, Absent())
        from dali_bridge.cli.main import main
        code = main(["run", "imagenet_val", "--data", {str(sample_root)!r}, "--batches", "1", "-q"])
        leaked = sorted(b for b in BLOCKED if b in sys.modules)
        print("LEAKED", leaked)
        sys.exit(code)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "LEAKED []" in done.stdout
    assert "torchvision" in done.stdout   # the backend a base install runs
