"""``python -m dali_bridge``: the ``dali-bridge`` command line."""
import sys

from .cli.main import main

sys.exit(main())
