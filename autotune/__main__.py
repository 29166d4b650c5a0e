"""``python -m autotune``: the same as the ``autotune`` command."""

from autotune.cli import main

if __name__ == "__main__":  # not when a spawned worker process imports this module
    main()
