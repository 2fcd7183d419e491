"""The web viewer: batches, runs and the fleet as pages, at ``/`` of ``toolq serve`` and of
``toolq view OUTPUT.jsonl``.

Pages are rendered on the server (Jinja2, every text escaped). The browser gets a shell page that
holds no data, and fetches each page's content with the API's bearer token from the tab's
session storage; live pages follow server-sent events with a short-lived ticket, since an
``EventSource`` cannot send a header. Charts are SVG drawn on the server. The only script is our
own ``static/viewer.js``; nothing is loaded from elsewhere, so the pages work offline.
"""
