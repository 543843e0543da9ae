"""Package discovery only; every other setting lives in pyproject.toml.

Every package lives under ``specconv/`` (converters and templates included), so
``find_packages`` lands each sub-package, present or future, in the wheel without a list
(``tests/structure/test_packaging.py`` checks it).
"""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["specconv", "specconv.*"]))
