"""The step loop: engine, scheduler, sequences, requests, events, streams, output assembly, KV cache."""
