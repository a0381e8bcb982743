"""The safetensors format: the header (strict validation, header bytes), tensor reads, the streaming shard
writer."""
