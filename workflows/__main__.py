"""``python -m workflows``: list the workflows, or run one (``python -m workflows retrain ...``)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from workflows import WORKFLOWS


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "list"):
        print("usage: python -m workflows.<workflow> --config FILE.yaml [--dry-run] [--force]")
        print("       python -m workflows <workflow> --config FILE.yaml ...\n")
        print("workflows:")
        for name, text in WORKFLOWS.items():
            print(f"  {name:<16} {text}")
        print("\nSee workflows/README.md for scheduling (cron, systemd), logs and exit codes.")
        return 0 if args else 2
    name = args[0].replace("-", "_")
    if name not in WORKFLOWS:
        print(
            f"workflows: error: unknown workflow {args[0]!r}. Known: {', '.join(WORKFLOWS)}.",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"workflows.{name}")
    return int(module.main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
