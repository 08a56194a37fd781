"""Task accuracy beside agreement: a sandbox for code the model wrote (``sandbox``)."""
