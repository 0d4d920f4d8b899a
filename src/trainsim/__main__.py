"""`python -m trainsim ...` runs the command line (the same as the `trainsim` console script)."""

from trainsim.cli.main import main

if __name__ == "__main__":
    main()
