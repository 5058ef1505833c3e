"""`python -m simulator.cli`: the servesim CLI."""

from simulator.cli.main import main

main()
