"""`python -m simulator`: the servesim CLI, for when the console script is not on PATH."""

from simulator.cli.main import main

main()
