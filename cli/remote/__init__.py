"""Remote engines: a server (vLLM, SGLang, llama-server, infer serve) standing in for the local engine."""
