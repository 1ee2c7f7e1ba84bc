"""Stubs generated from proto/floodgate/v1/floodgate.proto by scripts/generate. Do not edit."""
