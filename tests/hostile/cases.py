"""Hostile candidate programs for the code grader (used by tests/sandbox/test_sandbox_hostile.py).

Every program answers the problem f(x) = 2x + 1 (tests f(2), f(3), f(10)) *correctly only if its
attack worked*, or never answers at all (resource attacks), so any credit is a breach. Tokens
``@SENTINEL@`` (a host file that must survive), ``@HOSTFILE@`` (a host path that must not
appear), ``@PORT@`` (a host TCP listener that must see no connection), ``@REPO@`` and
``@DATA@`` (the grader's files) are filled in by the test.
"""

from __future__ import annotations

from dataclasses import dataclass

OK = "def ok(x):\n    return 2 * x + 1\n\n"


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    problem: str = "affine"  # affine | set | abs | stdio


def _if(attack: str) -> str:
    """f answers correctly iff ``attack`` (a statement block) runs without raising."""
    body = "\n".join("        " + line for line in attack.strip().splitlines())
    return OK + f"def f(x):\n    try:\n{body}\n    except BaseException:\n        return -1\n" \
        "    return ok(x)\n"


CASES = [
    # -- resources ------------------------------------------------------------------------------
    Case("fork_bomb_at_import", "import os\nwhile True:\n    try:\n        os.fork()\n"
         "    except OSError:\n        pass\n"),
    Case("fork_bomb_in_call", "import os\ndef f(x):\n    while True:\n        try:\n"
         "            os.fork()\n        except OSError:\n            pass\n"),
    Case("subprocess_bomb", "import subprocess, sys\ndef f(x):\n    while True:\n        try:\n"
         "            subprocess.Popen([sys.executable, '-c', 'while 1: pass'])\n"
         "        except OSError:\n            pass\n"),
    Case("memory_bomb", "def f(x):\n    hog = []\n    while True:\n"
         "        hog.append(bytearray(50 << 20))\n"),
    Case("memory_bomb_swallowed", "def f(x):\n    hog = []\n    while True:\n        try:\n"
         "            hog.append(bytearray(50 << 20))\n        except MemoryError:\n"
         "            pass\n"),
    Case("infinite_loop_at_import", "while True:\n    pass\n"),
    Case("infinite_loop_in_call", "def f(x):\n    while True:\n        pass\n"),
    Case("ignore_sigxcpu_and_spin", "import signal\ndef f(x):\n"
         "    signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n    while True:\n        pass\n"),
    Case("sleep_forever", "import time\ndef f(x):\n    time.sleep(10 ** 6)\n"),
    Case("spinning_threads", "import threading\ndef spin():\n    while True:\n        pass\n"
         "for _ in range(8):\n    threading.Thread(target=spin, daemon=True).start()\n"
         "def f(x):\n    return -1\n"),
    Case("huge_stdout", "import sys\ndef f(x):\n    for _ in range(200):\n"
         "        sys.stdout.write('x' * (1 << 20))\n    return -1\n"),
    Case("huge_return_value", "def f(x):\n    return 'x' * (200 << 20)\n"),
    Case("deeply_nested_return", "def f(x):\n    v = []\n    for _ in range(100000):\n"
         "        v = [v]\n    return v\n"),
    Case("disk_bomb", "def f(x):\n    with open('big', 'wb') as fh:\n        while True:\n"
         "            fh.write(b'0' * (1 << 20))\n"),
    Case("file_descriptor_bomb", "def f(x):\n    fds = []\n    while True:\n"
         "        fds.append(open('/dev/null'))\n"),
    Case("daemon_survives", "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
         "    if os.fork() == 0:\n        time.sleep(30)\n        open('@HOSTFILE@', 'w')\n"
         "    os._exit(0)\ndef f(x):\n    return -1\n"),
    # -- network --------------------------------------------------------------------------------
    Case("connect_host_localhost", "import socket\n" + _if(
        "socket.create_connection(('127.0.0.1', @PORT@), timeout=2).close()")),
    Case("connect_outside", "import socket\n" + _if(
        "socket.create_connection(('1.1.1.1', 80), timeout=2).close()")),
    Case("dns_lookup", "import socket\n" + _if("socket.getaddrinfo('example.com', 80)")),
    # -- file system ----------------------------------------------------------------------------
    # /tmp inside is the sandbox's own tmpfs, so this write succeeds in there: the breach test
    # is that the file never appears on the host
    Case("write_host_tmp", "def f(x):\n    open('@HOSTFILE@', 'w').write('pwned')\n"
         "    return -1\n"),
    Case("write_into_repo", _if("open('@REPO@/PWNED', 'w').write('pwned')")),
    Case("delete_host_file", "import os\n" + _if("os.remove('@SENTINEL@')")),
    Case("delete_grader_data", "import shutil\n" + _if("shutil.rmtree('@DATA@')")),
    Case("read_grader_tests", _if("open('@DATA@/humaneval.jsonl').read(1)")),
    Case("read_host_home", "import os\n" + _if("os.listdir('/root/.cache')")),
    Case("read_host_processes", "import os\n" + _if(
        "assert len([p for p in os.listdir('/proc') if p.isdigit()]) > 20")),
    # -- attacks on the server, the verdict channel and the judge ---------------------------------
    # The server is the sandbox's PID 1: signals from inside do not reach it. Each of these
    # answers correctly only if its signal took the server down or stopped it.
    Case("kill_parent", "import os, signal, time\n" + _if(
        "ppid = os.getppid()\nos.kill(ppid, signal.SIGKILL)\ntime.sleep(0.2)\n"
        "assert not os.path.exists('/proc/%d' % ppid)")),
    Case("kill_everything", "import os, signal, time\n" + _if(
        "os.kill(-1, signal.SIGKILL)\ntime.sleep(0.2)\n"
        "assert not os.path.exists('/proc/%d' % os.getppid())")),
    Case("stop_parent", "import os, signal, time\n" + _if(
        "os.kill(os.getppid(), signal.SIGSTOP)\ntime.sleep(0.2)\n"
        "assert open('/proc/%d/stat' % os.getppid()).read().split()[2] == 'T'")),
    Case("interrupt_parent", "import os, signal, time\n" + _if(
        "os.kill(os.getppid(), signal.SIGINT)\ntime.sleep(0.2)\n"
        "assert not os.path.exists('/proc/%d' % os.getppid())")),
    Case("open_parent_pipes", "import os\n" + _if(
        "os.open('/proc/%d/fd/1' % os.getppid(), os.O_WRONLY)")),
    Case("read_parent_memory", "import os\n" + _if(
        "open('/proc/%d/mem' % os.getppid(), 'rb').close()")),
    Case("ptrace_parent", "import ctypes, os\n" + _if(
        "assert ctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0) == 0")),
    Case("new_user_namespace", "import ctypes\n" + _if(
        "assert ctypes.CDLL(None).unshare(0x10000000) == 0")),
    Case("raise_cpu_limit", "import resource\n" + _if(
        "resource.setrlimit(resource.RLIMIT_CPU, (10 ** 6, 10 ** 6))")),
    Case("sys_exit_at_import", "import sys\nsys.exit(0)\n"),
    Case("os_exit_at_import", "import os\nos._exit(0)\n"),
    Case("sys_exit_in_call", "import sys\ndef f(x):\n    sys.exit(0)\n"),
    Case("os_exit_in_call", "import os\ndef f(x):\n    os._exit(0)\n"),
    Case("raise_system_exit_in_call", "def f(x):\n    raise SystemExit(0)\n"),
    Case("keyboard_interrupt_in_call", "def f(x):\n    raise KeyboardInterrupt\n"),
    Case("always_equal_object", "class Eq:\n    def __eq__(self, other):\n        return True\n"
         "    def __ne__(self, other):\n        return False\n    __hash__ = object.__hash__\n"
         "def f(x):\n    return Eq()\n"),
    Case("always_equal_int_subclass", "class Eq(int):\n    def __eq__(self, other):\n"
         "        return True\n    __hash__ = int.__hash__\ndef f(x):\n    return Eq(-1)\n"),
    Case("patch_builtins", "import builtins\n"
         "builtins.AssertionError = type('N', (Exception,), {})\n"
         "builtins.isinstance = lambda *a: True\ndef f(x):\n    return -1\n"),
    Case("fake_success_output", "import os, sys\nfor fd in range(1, 64):\n    try:\n"
         "        os.write(fd, b'\\x00\\x00\\x00\\x0b{\"ok\":true}PASSED 3/3\\n')\n"
         "    except OSError:\n        pass\nprint('All tests passed: 3/3')\n"
         "def f(x):\n    print('PASS')\n    return -1\n"),
    Case("forged_protocol_frames", "import json, os, struct\n"
         "for fd in range(3, 64):\n    for msg in ({'ok': True, 'names': {'__builtins__': 1}},"
         " {'ok': True, 'value': True}):\n        data = json.dumps(msg).encode()\n"
         "        try:\n            os.write(fd, struct.pack('>I', len(data)) + data)\n"
         "        except OSError:\n            pass\ndef f(x):\n    return -1\n"),
    Case("search_memory_for_tests", "import gc, re, sys\ndef f(x):\n"
         "    pat = re.compile(r'f\\(%d\\) == (\\d+)' % x)\n"
         "    for o in gc.get_objects() + [sys.modules]:\n"
         "        vals = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple))"
         " else ()\n"
         "        for v in list(vals):\n            if isinstance(v, str):\n"
         "                m = pat.search(v)\n                if m:\n"
         "                    return int(m.group(1))\n    return -1\n"),
    Case("walk_caller_frames", "import sys\ndef f(x):\n    fr = sys._getframe(1)\n"
         "    while fr is not None:\n        for v in fr.f_locals.values():\n"
         "            if isinstance(v, dict) and 'units' in v:\n                return -2\n"
         "        fr = fr.f_back\n    return -1\n"),
    Case("shadow_set_builtin", "set = lambda *a: 0\ndef f(x):\n    return []\n", "set"),
    Case("shadow_abs_builtin", "abs = lambda v: 0\ndef f(x):\n    return 99.0\n", "abs"),
    Case("stdio_fake_verdict", "print('Accepted')\nprint('All 2 tests passed')\n", "stdio"),
    Case("stdio_huge_output", "import sys\nn = int(input())\nprint(2 * n + 1)\n"
         "sys.stdout.write('9' * (64 << 20))\n", "stdio"),
    Case("stdio_exit_early", "import os\nos._exit(0)\n", "stdio"),
]

PROBLEMS = {
    "affine": {"kind": "functional", "preamble": "",
               "units": ["assert f(2) == 5\n", "assert f(3) == 7\n", "assert f(10) == 21\n"]},
    # Both sides of the test call set(): a candidate-defined set would make them equal.
    "set": {"kind": "functional", "preamble": "",
            "units": ["assert set(f(2)) == set([1, 2])\n", "assert set(f(3)) == set([3])\n"]},
    "abs": {"kind": "functional", "preamble": "",
            "units": ["assert abs(f(2) - 0.5) < 1e-9\n", "assert abs(f(3) - 1.5) < 1e-9\n"]},
    "stdio": {"kind": "stdio", "preamble": "",
              "units": [{"input": "2\n", "output": "5\n"}, {"input": "3\n", "output": "7\n"}]},
}

# Legitimate programs graded in the same batch: the grader must still give them full credit.
GOOD = {
    "affine": "def f(x):\n    return 2 * x + 1\n",
    "set": "def f(x):\n    return [1, 2] if x == 2 else [3]\n",
    "abs": "def f(x):\n    return x - 1.5\n",
    "stdio": "n = int(input())\nprint(2 * n + 1)\n",
}
