"""The old command line of fedagg.results.report (python -m fedagg.results): kept for existing notes and habits."""

import sys

from fedagg.results.report import main

if __name__ == "__main__":
    sys.exit(main())
