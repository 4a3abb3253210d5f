"""Packages of the distribution: cropi as it is, services/ as ``cropi_service`` (jobs/ is not a package).

Everything else is in pyproject.toml; this file exists only because setuptools' package
finder cannot install a folder under another name.
"""

from setuptools import find_packages, setup

SERVICE = "cropi_service"

setup(
    packages=find_packages(include=["cropi", "cropi.*"])
    + [SERVICE] + [f"{SERVICE}.{p}" for p in find_packages("services")],
    package_dir={SERVICE: "services"},
)
