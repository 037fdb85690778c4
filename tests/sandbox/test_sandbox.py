"""harness.sandbox: the one-shot API (the agentic python tool's), its limits, the fallback, and
the judge-side codec and proxies of the fork server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import harness.sandbox as sb
from harness.sandbox import Limits, layers, run_python
from harness.sandbox.remote import ForkServer, Proxy, RemoteError, decode, encode

needs_bwrap = pytest.mark.skipif(
    os.environ.get("RLBENCH_SANDBOX") == "rlimits" or sb.probe().mode != "bwrap",
    reason="needs bubblewrap (apt-get install bubblewrap)")


def test_run_python_returns_stdout_stderr_and_exit_status():
    r = run_python("import sys\nprint(input()[::-1])\nprint('e', file=sys.stderr)\nsys.exit(3)",
                   stdin=b"abc\n")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == (b"cba\n", b"e\n", 3, False)
    assert not r.ok


def test_wall_timeout_kills_the_program_and_reports_it():
    start = time.monotonic()
    r = run_python("import time\ntime.sleep(60)", limits=Limits(wall_s=1.0))
    assert r.timed_out and r.exit_code is None and r.signal is not None
    assert time.monotonic() - start < 10


def test_cpu_limit_stops_a_busy_loop():
    r = run_python("while True: pass", limits=Limits(wall_s=20.0, cpu_s=1.0))
    assert not r.ok and r.wall_s < 15


def test_output_is_capped_and_flagged():
    r = run_python("import sys\nwhile True: sys.stdout.write('x' * 65536)",
                   limits=Limits(wall_s=10.0, max_output_bytes=100_000))
    assert r.output_truncated and len(r.stdout) <= 100_000 and not r.ok


def test_memory_limit_raises_memory_error():
    r = run_python("b = bytearray(2 << 30)", limits=Limits(memory_mb=256))
    assert r.exit_code == 1 and b"MemoryError" in r.stderr


@needs_bwrap
def test_no_network_and_no_host_files_under_bubblewrap(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    code = (
        "import os, socket\n"
        "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=2); print('NET')\n"
        "except OSError: pass\n"
        f"print(os.path.exists({str(secret)!r}), os.path.exists({str(Path.cwd())!r}))\n"
        "open('/tmp/x', 'w').write('private'); print(open('/tmp/x').read())\n"
        "print(os.getuid())\n"
    )
    r = run_python(code)
    assert r.isolation == "bwrap"
    assert r.stdout.decode().split() == ["False", "False", "private", "65534"]


@needs_bwrap
def test_a_background_process_dies_with_the_run():
    marker = f"rlbench-bg-{os.getpid()}-{time.time_ns()}"
    code = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(60)', {marker!r}], start_new_session=True)\nprint('ok')")
    r = run_python(code, limits=Limits(wall_s=5.0))
    assert r.stdout == b"ok\n"
    time.sleep(0.3)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in ps


def test_fallback_runs_with_rlimits_and_warns_once(own_host_uid, monkeypatch, capfd):
    monkeypatch.setenv(sb.ENV_VAR, "rlimits")
    monkeypatch.setattr(layers, "_announced", set())
    with pytest.warns(RuntimeWarning, match="missing namespaces"):
        r = run_python("import os\nprint(6 * 7, os.getuid() == 0)")
    assert r.isolation == "rlimits"
    # a root grader still drops the candidate to an unprivileged uid in the fallback
    assert r.stdout == b"42 False\n"
    err = capfd.readouterr().err
    assert err.count("weaker than configured") == 1 and "RLBENCH_SANDBOX=rlimits" in err
    r = run_python("while True: pass", limits=Limits(wall_s=1.0))  # no second warning
    assert r.timed_out
    assert "weaker than configured" not in capfd.readouterr().err


def test_insisting_on_bubblewrap_without_it_fails_loudly(own_host_uid, monkeypatch):
    monkeypatch.setenv(sb.ENV_VAR, "bwrap")
    real_which = layers.shutil.which
    monkeypatch.setattr(layers.shutil, "which",
                        lambda name, **kw: None if name == "bwrap" else real_which(name, **kw))
    layers._probe.cache_clear()
    try:
        with pytest.raises(sb.SandboxUnavailableError, match="apt-get install bubblewrap"):
            sb.isolation()
    finally:
        layers._probe.cache_clear()


# -- fork server and codec -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    s = ForkServer()
    yield s
    s.close()


def test_calls_cross_as_plain_data_and_objects_stay_opaque(server):
    code = ("class Box:\n    def __init__(self, v):\n        self.v = v\n"
            "    def __eq__(self, other):\n        return True\n"
            "def f(x, d):\n    x.append(3)\n"
            "    return {'t': (1, 2.5, None), 's': {b'a'}, 'c': 1j}\n"
            "def g():\n    return Box(1)\n")
    ns = server.load(code, timeout=5, cpu_s=5, call_timeout=5).namespace()
    arg = [1]
    assert ns["f"](arg, {"k": [1]}) == {"t": (1, 2.5, None), "s": {b"a"}, "c": 1j}
    assert arg == [1, 3]  # in-place change mirrored back
    box = ns["g"]()
    assert isinstance(box, Proxy) and box != 1 and box.v == 1
    box.v = 5
    assert box.v == 5
    server.unload()


def test_a_candidate_cannot_shadow_the_judges_builtins(server):
    session = server.load("abs = lambda v: 0\nset = 1\nimport math\ndef f(): return 1\n",
                          timeout=5, cpu_s=5, call_timeout=5)
    ns = session.namespace()
    assert "abs" not in ns and "set" not in ns and ns["math"] is __import__("math")
    assert "set" in session.namespace(allow={"set"})
    server.unload()


def test_decode_rejects_malformed_or_deep_values():
    with pytest.raises(RemoteError):
        decode({"t": "eval", "v": "1"}, None)  # type: ignore[arg-type]
    deep: object = 1
    for _ in range(300):
        deep = {"t": "list", "v": [deep]}
    with pytest.raises(RemoteError):
        decode(deep, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode(lambda: 1)
    assert encode(int) == {"t": "builtin", "v": "int"}


def test_python_executable_is_the_base_interpreter():
    assert Path(sb.python_executable()).exists()
    assert ".venv" not in sb.python_executable() or sys.prefix == sys.base_prefix


def test_the_fork_server_also_works_in_the_fallback(own_host_uid, monkeypatch):
    monkeypatch.setenv(sb.ENV_VAR, "rlimits")
    server = ForkServer()
    try:
        ns = server.load("def f(x):\n    return 2 * x + 1\n", timeout=5, cpu_s=5,
                         call_timeout=5).namespace()
        assert ns["f"](3) == 7 and server.isolation == "rlimits"
        slow = server.load("def f():\n    while True: pass\n", timeout=5, cpu_s=5,
                           call_timeout=0.5).namespace()
        with pytest.raises(RemoteError):
            slow["f"]()
        out = server.run_stdio("print(int(input()) + 1)", "41\n", timeout=5, cpu_s=5)
        assert out.stdout == b"42\n" and out.exit_code == 0
    finally:
        server.close()
