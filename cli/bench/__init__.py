"""`infer bench`: local and server throughput runs and their statistics."""
