"""`python -m dflash2_cli`: the `dflash2` command."""

from .app import main

main()
