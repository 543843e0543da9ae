"""Package discovery only; every other setting lives in pyproject.toml.

``converters/`` and ``templates/`` sit at the top of the repository but install as
``specconv.converters`` / ``specconv.templates`` (``[tool.setuptools.package-dir]``).
``[tool.setuptools.packages.find]`` cannot add that prefix (it names packages after their
directories), so the three roots are searched here with ``find_packages`` and every
sub-package, present or future, lands in the wheel (``tests/test_packaging.py`` checks it).
"""

from setuptools import find_packages, setup


def _under(prefix: str, where: str) -> list[str]:
    return [prefix] + [f"{prefix}.{p}" for p in find_packages(where)]


setup(packages=find_packages(include=["specconv", "specconv.*"])
      + _under("specconv.converters", "converters") + _under("specconv.templates", "templates"))
