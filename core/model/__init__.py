"""Policies: the base contract, processors, PEFT adapters, model assembly."""
