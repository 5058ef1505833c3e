"""`python -m servesim`: the servesim CLI, for when the console script is not on PATH."""

from servesim.simulator.cli.main import main

main()
