"""The upstream simulator: dedicated (shared-throughput GPU replica) and serverless."""
