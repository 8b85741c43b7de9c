"""`infer serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn) over the engine."""
