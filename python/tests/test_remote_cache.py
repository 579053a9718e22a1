"""The fleet tier from Python: a real redis-server on a loopback port of its own, two "nodes"
(processes with their own cache directories), kiln.warmup and kiln.cache_stats()["remote"]."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (scripts/install-deps.sh installs it)")

NODE = """
import json, sys, kiln
if sys.argv[1] == "off":
    kiln.set_jit(False)
report = kiln.warmup("llama-3.1-8b", "sm_90a")
print(json.dumps({"report": report, "stats": kiln.cache_stats()}))
"""


@pytest.fixture
def redis_url(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                               "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(500):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                time.sleep(0.01)
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


def node(tmp_path, name, url, jit):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_CACHE")}
    env.update(KILN_CACHE_DIR=str(tmp_path / name), KILN_CACHE_REMOTE=url)
    out = subprocess.run([sys.executable, "-c", NODE, jit], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_node_without_the_jit_is_served_by_the_one_that_compiled(tmp_path, redis_url):
    a = node(tmp_path, "a", redis_url, "on")
    assert a["report"]["failed"] == 0 and a["report"]["compiled"] > 0, a["report"]
    assert a["stats"]["remote"]["state"] == "on" and a["stats"]["remote"]["url"].startswith("redis://127.0.0.1:")
    assert a["stats"]["remote"]["misses"] == a["report"]["compiled"], a["stats"]["remote"]

    b = node(tmp_path, "b", redis_url, "off")
    assert b["report"]["failed"] == 0 and b["report"]["compiled"] == 0, b["report"]
    remote = b["stats"]["remote"]
    # Signatures that share a binary may each fetch it: at least one hit per compiled key.
    assert remote["hits"] >= a["report"]["compiled"] and remote["refused"] == 0 and remote["errors"] == 0, remote
    assert remote["bytes_read"] > 0
    assert {item["origin"] for item in b["report"]["items"]} <= {"remote", "memory", "disk"}, b["report"]["items"]


def test_without_a_remote_the_stats_say_off():
    import kiln
    if os.environ.get("KILN_CACHE_REMOTE"):
        pytest.skip("this process was started with KILN_CACHE_REMOTE set")
    assert kiln.cache_stats()["remote"]["state"] == "off"
