"""The sandbox's child side: run as a script by a fresh `python -I -S -B` (align.sandbox.run), never imported by
align at run time. Stdlib only: with -I the interpreter sees neither the repository nor site-packages.

    stdin   one JSON job: {"nonce", "steps": [[kind, source], ...], "limits": {...}, "namespaces", "drop_uid",
            "audit", "preload", "readable"}
    argv[1] the result descriptor: lines "<nonce> <event> ..." (the parent ignores every line without the nonce)

Order (every step before the model's code runs):
    1. new network and PID namespaces (unshare(2) through libc; as root directly, else inside a new user namespace);
       whatever the kernel refuses is reported as a missing layer, never silently assumed
    2. fork; with a PID namespace the child is its PID 1 and only reaps: the program runs in a grandchild, and when
       PID 1 exits the kernel kills every process left in the namespace (a fork bomb dies with it)
    3. in the program's process: resource limits (CPU s, address space, file size, processes, descriptors, no core),
       root -> nobody (uid/gid 65534, no supplementary groups), the audit hook (`_audit`), then the steps: "program"
       (the model's code), "setup" (a test file's imports and definitions) and "test" (an assert or a call), each
       exec'd in one namespace; after each test "<nonce> test <i> 1|0" goes to the result descriptor

The audit hook is a seatbelt, not a wall (CPython: audit hooks are not a sandbox): it refuses sockets, process
creation, signals to other processes, ctypes and a few low-level modules, and opening a path outside the working
directory and the standard library. Code that gets to C (a CPython memory bug, a C module the hook does not know)
passes it; the kernel's layers (namespaces, rlimits, uid) still hold then."""

import functools
import json
import os
import resource
import sys

CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG = 1
_die_with_parent = None  # prctl(PR_SET_PDEATHSIG, SIGKILL) for this process, set by `isolate`
NOBODY = 65534
DENIED_MODULES = ("ctypes", "_ctypes", "_posixsubprocess", "subprocess", "multiprocessing", "_multiprocessing",
                  "socket", "_socket", "ssl", "_ssl", "asyncio", "pty", "mmap", "_xxsubinterpreters")
DENIED_EVENTS = ("os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.kill",
                 "os.killpg", "os.setuid", "os.setgid", "os.setsid", "os.setpgid", "os.chroot",
                 "subprocess.Popen", "signal.pthread_kill", "sys.addaudithook", "socket.__new__", "socket.connect",
                 "socket.bind", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto", "mmap.__new__",
                 "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "os.link", "os.symlink",
                 "os.mkfifo", "os.mknod", "os.chown", "shutil.chown")
# Imported before the uid drop when nobody cannot read the standard library (an interpreter under /root): the
# program may then import only these; any other module is imported as nobody, through the audit hook's read rule
PRELOAD = ("builtins", "traceback", "math", "cmath", "re", "collections", "itertools", "functools", "heapq", "bisect",
           "string", "typing", "dataclasses", "fractions", "decimal", "statistics", "random", "copy", "operator",
           "json", "datetime", "array", "numbers", "enum", "textwrap", "unicodedata", "hashlib", "time", "queue",
           "contextlib", "abc", "collections.abc", "signal", "struct", "io", "types", "errno", "weakref", "warnings",
           "base64", "binascii")
PATH_EVENTS = ("open", "os.listdir", "os.scandir", "os.chdir", "os.rename", "os.remove", "os.rmdir", "os.mkdir",
               "os.chmod", "os.truncate", "os.utime", "glob.glob", "shutil.rmtree", "shutil.copyfile")


def isolate(want: bool) -> dict:
    """New network + PID namespaces where the kernel allows; the layers that hold, by name."""
    layers = {"netns": False, "pidns": False, "userns": False}
    import ctypes  # NOTE: removed from sys.modules below, so the program's `import ctypes` hits the audit hook

    global _die_with_parent
    libc = ctypes.CDLL(None, use_errno=True)
    _die_with_parent = functools.partial(libc.prctl, PR_SET_PDEATHSIG, 9)  # kept for the forked children
    _die_with_parent()  # the trainer gone (killed mid-run): SIGKILL to this harness, and (the setting is not
    # inherited by fork) to PID 1 and the program when their parents go: nothing outlives the run's owner
    if not want:
        del libc
        _forget_ctypes()
        return layers
    tries = [CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET] if os.geteuid() == 0 else []
    tries += [CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWUSER | CLONE_NEWNET]
    for flags in tries:
        if libc.unshare(flags) == 0:
            layers = {"netns": True, "pidns": bool(flags & CLONE_NEWPID), "userns": bool(flags & CLONE_NEWUSER)}
            break
    del libc
    _forget_ctypes()
    return layers


def _forget_ctypes() -> None:
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
        del sys.modules[name]


def limit(limits: dict) -> None:
    mib = 1 << 20
    for key, value in ((resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1)),
                       (resource.RLIMIT_AS, (limits["memory_mb"] * mib,) * 2),
                       (resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mib,) * 2),
                       (resource.RLIMIT_NPROC, (limits["max_processes"],) * 2),
                       (resource.RLIMIT_NOFILE, (64, 64)), (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(key, value)


def drop_uid() -> bool:
    """Root -> nobody: the process limit then binds (root is exempt from RLIMIT_NPROC) and root-only files close."""
    if os.geteuid() != 0:
        return False
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    return True


def _audit(readable: tuple[str, ...], home: str):
    """The hook: refuse the events above and any path outside `home` (write) or `readable` (read)."""
    denied_events = frozenset(DENIED_EVENTS)
    denied_modules = frozenset(DENIED_MODULES)
    path_events = frozenset(PATH_EVENTS)
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep

    def inside(path: str, roots: tuple[str, ...]) -> bool:
        return any(path == r or path.startswith(r.rstrip(sep) + sep) for r in roots)

    def hook(event: str, args: tuple) -> None:
        if event in denied_events or event.startswith("os.exec") or event.startswith("os.spawn"):
            raise PermissionError(f"sandbox: {event} refused")
        if event == "import" and args and str(args[0]).split(".")[0] in denied_modules:
            raise PermissionError(f"sandbox: import {args[0]} refused")
        if event in path_events and args:
            target = args[0]
            if isinstance(target, int) or target is None:
                return
            path = realpath(fspath(target) if not isinstance(target, bytes) else target.decode(errors="replace"))
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            write = event != "open" or any(c in mode for c in "wax+")
            if event == "open" and len(args) > 2 and isinstance(args[2], int):
                write = write or bool(args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if event in ("os.listdir", "os.scandir", "os.chdir", "glob.glob"):
                write = False
            if not inside(path, (home,) if write else (home, *readable)):
                raise PermissionError(f"sandbox: {event} {path} refused (outside the sandbox)")

    return hook


def run_steps(job: dict, fd: int) -> None:
    """Exec the steps in one namespace; a test's verdict goes out as soon as it is known."""
    import builtins
    import traceback

    nonce = job["nonce"]

    def say(text: str) -> None:
        os.write(fd, f"{nonce} {text}\n".encode())

    scope = {"__name__": "solution", "__builtins__": builtins}
    program_ok, index = True, 0
    for kind, source in job["steps"]:
        ok = True
        try:
            exec(compile(source, f"<{kind}>", "exec"), scope)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the program's exit is a failure
            ok = False
            if kind != "test":
                sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc))[-2000:])
        if kind == "program" and not ok:
            program_ok = False
            say("program 0")
        if kind == "test":
            say(f"test {index} {int(ok and program_ok)}")
            index += 1
    say("done")


def program_process(job: dict, fd: int) -> None:
    global _die_with_parent
    try:
        for name in PRELOAD if job["preload"] else ():
            try:
                __import__(name)
            except ImportError:
                pass
        limit(job["limits"])
        dropped = drop_uid() if job["drop_uid"] else False
        _die_with_parent()  # after the uid change, which clears the setting
        _die_with_parent = None  # the program could reach it through __main__
        os.write(fd, f"{job['nonce']} uid {int(dropped)}{'a' if job['audit'] else ''}\n".encode())
        if job["audit"]:
            sys.addaudithook(_audit(tuple(p for p in job["readable"] if p), os.getcwd()))
        sys.stdin = None  # the job is read; the program gets no input
        run_steps(job, fd)
    except BaseException as exc:  # a harness failure: say why on stderr, exit non-zero
        sys.stderr.write(f"sandbox harness: {type(exc).__name__}: {exc}\n")
        code = 70
    else:
        code = 0
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def wait_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main() -> None:
    fd = int(sys.argv[1])
    job = json.loads(sys.stdin.read())
    layers = isolate(job["namespaces"])
    os.write(fd, f"{job['nonce']} layers {json.dumps(layers, separators=(',', ':'))}\n".encode())
    pid = os.fork()
    if pid == 0:
        if layers["pidns"]:  # PID 1 of the namespace: run the program one level down and reap
            _die_with_parent()
            child = os.fork()
            if child == 0:
                program_process(job, fd)
            code = wait_code(child)
            os._exit(code)  # PID 1 leaves: the kernel kills whatever the program left in the namespace
        program_process(job, fd)
    os._exit(wait_code(pid))


if __name__ == "__main__":
    main()
