import textwrap
from pathlib import Path

import pytest

from spiderflow.topology import parse_topology

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def write_yaml(tmp_path):
    def write(text: str, name: str = "topo.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write


def line_topology(bw=(1.0, 2.0), lat=(10.0, 20.0), gpu="a100-80gb", nodes=1):
    """a - b - c: two links, hand-checkable."""
    return parse_topology({
        "name": "line",
        "clusters": [{"name": n, "gpu": gpu, "nodes": nodes, "gpus_per_node": 8} for n in "abc"],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": bw[0], "latency_ms": lat[0]},
                  {"a": "b", "b": "c", "bandwidth_gbps": bw[1], "latency_ms": lat[1]}],
    })
