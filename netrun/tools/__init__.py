"""Developer tools run as modules: `python3 -m netrun.tools.ops_table > docs/operators.md`."""
