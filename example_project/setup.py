"""Packaging of the demo project for scrapyd: ``scrapyd-deploy`` builds an egg from this file.

Only the project's own package goes into the egg; ``meteorseed-scrapy`` (and Scrapy) must be
installed in the Python environment that runs scrapyd on every host (see docs/deploy.md). Without
this file scrapyd-deploy would write one here on every deploy.

The site rule files go in as package data (``demo_project/sites`` links to ``../sites``; the
build copies the files): ``METEORSEED_SITES_DIR = "pkg://demo_project/sites"`` reads them
with importlib.resources, from the checkout and from inside the egg alike.
"""

from setuptools import find_packages, setup

setup(
    name="demo_project",
    version="1.0",
    packages=find_packages(include=["demo_project", "demo_project.*"]),
    package_data={"demo_project": ["sites/*.yaml", "sites/*.yml", "sites/*.json"]},
    zip_safe=True,
    entry_points={"scrapy": ["settings = demo_project.settings"]},
)
