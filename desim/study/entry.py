"""The `desim` console command's entry point: Ctrl-C at any moment is one line and status 130.

The command line (`desim.study.cli`) imports numpy, pandas and the plug-ins, which takes a
noticeable time; a Ctrl-C during those imports would otherwise print a long traceback. This
module imports nothing heavy itself and imports the CLI inside the handler.
"""

from __future__ import annotations

import sys

#: Exit status after Ctrl-C (as a shell reports a process ended by SIGINT).
EXIT_INTERRUPTED = 130


def main() -> int:
    """Run the `desim` command (`desim.study.cli.main`); Ctrl-C while it starts exits 130."""
    try:
        from desim.study.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:  # while importing; the CLI handles it once it runs
        print("desim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
