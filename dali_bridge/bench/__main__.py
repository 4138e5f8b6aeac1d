"""``python -m dali_bridge.bench``: the benchmarks page and runs files (see :func:`report.main`)."""
import sys

from .report import main

sys.exit(main())
