"""`python -m netrun`: the same as the `netrun` console script."""
from netrun.cli import main

main()
