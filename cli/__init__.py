"""The `dflash2` command line (installed as the `dflash2_cli` package)."""
