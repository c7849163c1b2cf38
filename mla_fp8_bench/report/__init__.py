"""Reporting: what a person reads of stored results, e.g. the published asv site (``publish``, ``site_view``;
needs asv: ``pip install -e '.[site]'``)."""
