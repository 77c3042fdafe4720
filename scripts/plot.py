"""The old command line of fedagg.results.plots (python -m fedagg.results): kept for existing notes and habits."""

import sys

from fedagg.results.plots import main

if __name__ == "__main__":
    sys.exit(main())
