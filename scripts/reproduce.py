"""Reproduce the papers' experiments stage by stage: `python scripts/reproduce.py --help`. The code is the
package's `skillnet.experiments` (also installed as `skillnet-reproduce`)."""

import sys

from skillnet.experiments.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
