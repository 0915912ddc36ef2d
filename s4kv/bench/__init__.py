"""`s4kv bench`: KV-cache dtypes side by side (capacity, speed, quality); see s4kv.bench.cli."""
