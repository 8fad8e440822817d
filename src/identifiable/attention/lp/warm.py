"""Compile the engine into its disk cache and exit: `python -m identifiable.attention.lp.warm`.

Run by scripts/setup.sh (so that an install made with it starts warm) and, in the
background, by the first call that finds the cache cold (`compiled.start_warming`), which
meanwhile answers with HiGHS or waits for it (see `compiled.route`).
"""

from __future__ import annotations

import sys


def main() -> int:
    from identifiable.attention.lp import compiled
    from identifiable.errors import IdentifiableError

    try:
        compiled.ensure_compiled(quiet="--quiet" in sys.argv)
    except IdentifiableError as err:
        print(f"identifiable: {err}", file=sys.stderr)
        return 1
    finally:
        compiled.warming_file().unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
