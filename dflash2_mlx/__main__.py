from dflash2_cli.app import main

main()
