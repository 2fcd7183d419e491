"""The documentation site's generated pages: the reference of the ``toolq`` command, of every
setting and of the HTTP API, written from the code when the site is built so that they cannot
drift from it (``mkdocs.yml`` runs ``docsgen/hooks.py``)."""
