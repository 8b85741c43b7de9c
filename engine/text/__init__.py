"""Text in and out: tokenizer, incremental detokenizer, chat templates, prompt assembly."""
