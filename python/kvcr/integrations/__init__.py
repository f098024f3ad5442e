"""Framework integrations: vllm (the secondary tier)."""
