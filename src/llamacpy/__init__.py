"""llamacpy: llama.cpp's engine, formats and tools in Python."""

__version__ = "0.1.0"
