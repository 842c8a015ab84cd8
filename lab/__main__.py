"""``python -m lab …`` is the ``lab`` command (also what ``accelerate launch -m lab …`` runs)."""
import sys

from lab.cli import main

sys.exit(main())
