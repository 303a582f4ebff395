"""Closed-loop evaluation: policies driven in vectorised environments, measured against a scripted expert."""
