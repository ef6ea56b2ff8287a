"""execgate's benchmark harness (issue 6): ``python -m bench --help``.

Not part of the installed distribution; run it from the repository root with the interpreter of a
virtualenv in which execgate is installed (``pip install -e '.[test]'``). See ``BENCHMARKS.md``.
"""
