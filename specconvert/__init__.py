"""specconvert: a Hugging Face target + EAGLE-3 head -> a verified speculative-decoding deployment."""

__version__ = "0.1.0"
