"""The old command line of fedagg.results.table (python -m fedagg.results): kept for existing notes and habits."""

import sys

from fedagg.results.table import main

if __name__ == "__main__":
    sys.exit(main())
