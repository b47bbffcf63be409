"""An SGLang stand-in: same flags, log lines, HTTP API and failure texts, driven by a landscape.

The tuner is tested against it and new users run their first study on it; it imports nothing
from the tuner except the flag manifests (`search.manifests`).
"""
