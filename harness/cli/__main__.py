"""``python -m harness.cli`` is ``rlbench``."""

from harness.cli.main import main

if __name__ == "__main__":  # not when a spawned worker re-imports the parent's main module
    main()
