"""infer package."""
