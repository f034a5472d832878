"""``python -m autoslm`` is the CLI."""

from autoslm.cli import main

main()
