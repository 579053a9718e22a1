"""kiln inside other frameworks: `kiln.integrations.transformers` for Hugging Face Transformers."""
