"""Compile the engine into its disk cache and exit: `python -m identifiable.attention.lp.warm`.

Run by scripts/setup.sh (so that an install made with it starts warm) and, in the
background, by the first call that finds the cache cold or damaged
(`loading.start_warming`), which meanwhile answers with HiGHS or waits for it (see
`loading.route`).
"""

from __future__ import annotations

import sys


def main() -> int:
    from identifiable.attention.lp import loading
    from identifiable.errors import IdentifiableError

    try:
        loading.ensure_compiled(quiet="--quiet" in sys.argv)
    except IdentifiableError as err:
        print(f"identifiable: {err}", file=sys.stderr)
        return 1
    finally:
        flag = loading.warming_file()
        if flag is not None:
            flag.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
