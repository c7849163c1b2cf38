"""Reporting: figures (``plot``), the published asv site (``publish``, ``site_view``) and the merge of
several runners' results (``results_merge``). Optional: ``pip install -e '.[plot]'`` / ``'.[site]'``."""
