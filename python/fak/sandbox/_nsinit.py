"""PID 1 of an ``unshare``-made sandbox (the fallback where bubblewrap is missing).

Run as ``python -I -S _nsinit.py CONFIG_JSON`` by ``unshare --user --map-root-user --mount --pid
--fork --kill-child --ipc --uts [--net]``: root of a fresh user namespace, so it may mount in its
own mount namespace and nothing else. It does what bwrap does, in the same order:

1. hostname; ``lo`` up (``SIOCSIFFLAGS``) when the network namespace is its own;
2. a recursive bind of ``/`` at a staging point, made read-only and nosuid in one
   ``mount_setattr(AT_RECURSIVE)`` (Linux >= 5.12); a fresh ``/proc`` of the new PID namespace
   (``/proc/sys``, ``sysrq-trigger``, ``irq``, ``bus`` read-only), a minimal ``/dev`` (null, zero,
   full, random, urandom, tty, a private devpts), then the plan's mounts (tmpfs, read-only and
   read-write binds from ``O_PATH`` descriptors opened before the staging tmpfs hid anything);
3. no nested user namespaces (``user.max_user_namespaces = 0`` in its own user namespace);
4. ``pivot_root(".", ".")`` and a lazy unmount of the old root;
5. fork: the child drops every capability (bounding set, ambient, effective/permitted/inheritable),
   sets ``no_new_privs``, starts a new session and execs the command; PID 1 drops its
   capabilities too, reaps, and exits with the command's status (128 + signal for a signal) —
   the kernel then kills whatever the command left behind.

Any set-up failure prints ``fak-sandbox: ...`` on stderr and exits 125. Standard library only.
"""

import ctypes
import fcntl
import json
import os
import platform
import socket
import struct
import sys
import warnings  # noqa: F401 - os.execvp imports it; the stdlib may be hidden after pivot_root

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
SYS = {"x86_64": {"pivot_root": 155, "capset": 126, "mount_setattr": 442},
       "aarch64": {"pivot_root": 41, "capset": 91, "mount_setattr": 442}}
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
STAGE = "/tmp"
NEW_ROOT = "/tmp/.fak-root"

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.syscall.restype = ctypes.c_long


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(rc, what):
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(s):
    return None if s is None else os.fsencode(s)


def mount(src, target, fstype=None, flags=0, data=None):
    _check(libc.mount(_b(src), _b(target), _b(fstype), flags, _b(data)),
           f"mount {src} on {target}")


def setattr_tree(path, attr_set):
    """``mount_setattr(path, AT_RECURSIVE)``: set ``attr_set`` on the mount at ``path`` and below."""
    nr = SYS[platform.machine()]["mount_setattr"]
    attr = MountAttr(attr_set, 0, 0, 0)
    _check(libc.syscall(ctypes.c_long(nr), ctypes.c_int(AT_FDCWD), _b(path),
                        ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr),
                        ctypes.c_size_t(ctypes.sizeof(attr))), f"mount_setattr {path}")


def lo_up():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, req)[:18])[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))  # IFF_UP
    finally:
        s.close()


def ensure_mountpoint(path, is_dir):
    if os.path.lexists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if is_dir:
        os.mkdir(path)
    else:
        with open(path, "w"):
            pass


def bind(fd_or_path, dest, readonly):
    src = f"/proc/self/fd/{fd_or_path}" if isinstance(fd_or_path, int) else fd_or_path
    mount(src, dest, None, MS_BIND | MS_REC)
    setattr_tree(dest, MOUNT_ATTR_NOSUID | (MOUNT_ATTR_RDONLY if readonly else 0))


def in_init_userns():
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() == ["0", "0", "4294967295"]
    except OSError:
        return True


def drop_capabilities():
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    _check(libc.syscall(ctypes.c_long(SYS[platform.machine()]["capset"]), header, data), "capset")


def setup(cfg):
    libc.sethostname(cfg["hostname"].encode(), len(cfg["hostname"]))
    if cfg.get("lo_up"):
        lo_up()
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    fds = {}
    for m in cfg["mounts"]:
        if m["kind"] in ("ro", "rw"):
            fds[m["dest"]] = os.open(m["src"], os.O_PATH | os.O_CLOEXEC)
    root_fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
    mount("tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,mode=700")
    os.mkdir(NEW_ROOT)
    mount(f"/proc/self/fd/{root_fd}", NEW_ROOT, None, MS_BIND | MS_REC)
    setattr_tree(NEW_ROOT, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID)
    r = NEW_ROOT
    # /proc of the new PID namespace
    mount("proc", r + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if cfg.get("disable_userns") and not in_init_userns():
        with open(r + "/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0\n")
    for sub in ("sys", "sysrq-trigger", "irq", "bus"):
        p = f"{r}/proc/{sub}"
        if os.path.exists(p):
            bind(p, p, readonly=True)
    # a minimal /dev
    dev = r + "/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=65536,mode=755")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            ensure_mountpoint(f"{dev}/{name}", is_dir=False)
            mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    os.mkdir(dev + "/pts")
    mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=620")
    os.mkdir(dev + "/shm")
    for link, target in (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{link}")
    # the plan: tmpfs, binds, masks (shallow first, as planned)
    for m in cfg["mounts"]:
        dest = r + m["dest"]
        if m["kind"] == "tmpfs":
            try:
                os.makedirs(dest, exist_ok=True)  # under a tmpfs already: made, as bwrap does
            except OSError:
                continue  # not there on a read-only tree: nothing to hide
            mount("tmpfs", dest, "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={m['size'] or 0},mode={m['mode']:o}")
        elif m["kind"] in ("ro", "rw"):
            ensure_mountpoint(dest, is_dir=os.path.isdir(f"/proc/self/fd/{fds[m['dest']]}"))
            bind(fds[m["dest"]], dest, readonly=m["kind"] == "ro")
        elif m["kind"] == "mask" and os.path.isfile(dest):
            bind("/dev/null", dest, readonly=True)
    for fd in [*fds.values(), root_fd]:
        os.close(fd)
    os.chdir(r)
    _check(libc.syscall(ctypes.c_long(SYS[platform.machine()]["pivot_root"]), b".", b"."),
           "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    os.chdir(cfg["cwd"])


def main():
    cfg = json.loads(sys.argv[1])
    try:
        setup(cfg)
    except Exception as e:  # noqa: BLE001 - any set-up failure is fatal, and said so
        os.write(2, f"fak-sandbox: unshare set-up failed: {e}\n".encode())
        os._exit(125)
    argv = cfg["argv"]
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            drop_capabilities()
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"fak-sandbox: exec {argv[0]}: {e.strerror}\n".encode())
            os._exit(127 if e.errno == 2 else 126)
    try:
        drop_capabilities()
    except OSError:
        pass
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(125)
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
