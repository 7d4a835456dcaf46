"""tidegate: an OpenAI-compatible LLM gateway (dedicated baseline, serverless spill)."""
