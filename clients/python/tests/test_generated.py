"""The shipped stubs are what scripts/generate makes from the repository's proto."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHIPPED = os.path.join(ROOT, "floodgate_client", "_proto")


def test_the_shipped_stubs_match_the_proto(tmp_path):
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        pytest.skip("grpcio-tools is not installed: cannot regenerate the stubs to compare")
    out = tmp_path / "_proto"
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "generate"), str(out)], check=True)
    names = sorted(n for n in os.listdir(out) if not n.startswith("__pycache__"))
    shipped = sorted(n for n in os.listdir(SHIPPED) if n != "__pycache__")
    assert names == shipped
    stale = [n for n in names if not filecmp.cmp(str(out / n), os.path.join(SHIPPED, n), shallow=False)]
    assert not stale, "stale generated code (run scripts/generate): %s" % stale


def test_the_stubs_import_package_relative():
    from floodgate_client._proto import floodgate_pb2, floodgate_pb2_grpc

    assert floodgate_pb2_grpc.floodgate_dot_v1_dot_floodgate__pb2 is floodgate_pb2
    assert "floodgate" not in sys.modules or not hasattr(sys.modules["floodgate"], "v1")
