"""``lmi serve``: a local stand-in for DJLServing's Java front end (HTTP API, workers, batching)."""
