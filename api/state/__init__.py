"""What the HTTP API, its MCP endpoint and the agents pool keep in Redis: runs and batches
(their records, statuses and lists), replicas, each tenant's holdings, a run's event stream and
its cancel requests. Kept apart from ``api/http`` so that the agents workers, which write runs'
records too, never import the web app."""
