"""search: overnight Bayesian configuration search for SGLang inference servers."""

__version__ = "0.1.0"
