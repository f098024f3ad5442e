"""Framework integrations: vllm (the secondary tier), sglang (the HiCache storage backend)."""
