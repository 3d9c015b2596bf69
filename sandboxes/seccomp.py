"""The local sandbox's seccomp filter: an allow-list in the spirit of Docker's default profile.

Built with libseccomp (``libseccomp2``, through ctypes: no compiler, no Python binding needed)
and handed to bubblewrap as a BPF program (``--seccomp FD``). Calls not on the list fail with
``ENOSYS`` (so libc falls back to older calls, as under Docker); the dangerous ones below fail
with ``EPERM``: tracing other processes, namespaces (no nested user namespaces), mounts, kernel
keyrings, modules, BPF, perf, userfaultfd, io_uring. ``clone`` may not create namespaces and
``clone3`` answers ``ENOSYS`` (its flags sit in memory a filter cannot read), so libc uses
``clone``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import json
import os

from agentloop.errors import SandboxError

__all__ = ["DENIED", "SECCOMP_INSTALL_HINT", "docker_profile", "seccomp_filter"]

SECCOMP_INSTALL_HINT = (
    "libseccomp is not installed; install it with `apt-get install libseccomp2` (Fedora: "
    "`dnf install libseccomp`), or pass seccomp=False to run without a syscall filter"
)


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


#: Calls refused with EPERM: they reach other processes, namespaces or kernel subsystems that
#: sandboxed code has no business with.
DENIED = _words(
    "ptrace process_vm_readv process_vm_writev kcmp pidfd_getfd unshare setns mount umount2 "
    "pivot_root chroot mount_setattr move_mount open_tree fsopen fsconfig fsmount fspick "
    "keyctl add_key request_key bpf perf_event_open userfaultfd kexec_load kexec_file_load "
    "init_module finit_module delete_module open_by_handle_at name_to_handle_at reboot swapon "
    "swapoff acct syslog iopl ioperm quotactl quotactl_fd lookup_dcookie io_uring_setup "
    "io_uring_enter io_uring_register vhangup nfsservctl settimeofday clock_settime "
    "clock_adjtime adjtimex stime sethostname setdomainname uselib personality "
    "fanotify_init"
)

# Docker's default allow-list (moby profiles/seccomp/default.json), less what DENIED refuses.
_ALLOWED = _words("""
accept accept4 access alarm arch_prctl bind brk capget capset chdir chmod chown chown32
clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3
epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait
epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat faccessat2 fadvise64
fadvise64_64 fallocate fchdir fchmod fchmodat fchmodat2 fchown fchown32 fchownat fcntl fcntl64
fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64 fstatat64
fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_time64 futex_waitv futimesat
get_mempolicy get_robust_list get_thread_area getcpu getcwd getdents getdents64 getegid
getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32 getitimer getpeername
getpgid getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid
getresuid32 getrlimit getrusage getsid getsockname getsockopt gettid gettimeofday getuid
getuid32 getxattr inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel
io_destroy io_getevents io_pgetevents io_pgetevents_time64 io_setup io_submit ioctl ioprio_get
ioprio_set ipc kill landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown
lchown32 lgetxattr link linkat listen listxattr llistxattr lremovexattr lseek lsetxattr
lstat lstat64 madvise membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat
mlock mlock2 mlockall mmap mmap2 mprotect mq_getsetattr mq_notify mq_open mq_timedreceive
mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap msgctl msgget msgrcv
msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat open openat
openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll
ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6
pselect6_time64 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recv
recvfrom recvmmsg recvmmsg_time64 recvmsg remap_file_pages removexattr rename renameat
renameat2 restart_syscall rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo
rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo
sched_get_priority_max sched_get_priority_min sched_getaffinity sched_getattr sched_getparam
sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity
sched_setattr sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop
semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto set_mempolicy
set_robust_list set_thread_area set_tid_address setfsgid setfsgid32 setfsuid setfsuid32 setgid
setgid32 setgroups setgroups32 setitimer setpgid setpriority setregid setregid32 setresgid
setresgid32 setresuid setresuid32 setreuid setreuid32 setrlimit setsid setsockopt setuid
setuid32 setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask
sigreturn socket socketcall socketpair splice stat stat64 statfs statfs64 statx symlink
symlinkat sync sync_file_range syncfs sysinfo tee tgkill time timer_create timer_delete
timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate
truncate64 ugetrlimit umask uname unlink unlinkat utime utimensat utimensat_time64 utimes
vfork wait4 waitid waitpid write writev modify_ldt cacheflush set_tls arm_fadvise64_64
arm_sync_file_range breakpoint sync_file_range2
""")

_NAMESPACE_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x00000080  # CLONE_NEWTIME
)
_ACT_ALLOW = 0x7FFF0000
_CMP_MASKED_EQ = 7


def _errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise SandboxError(SECCOMP_INSTALL_HINT) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, *cmps: _ArgCmp) -> None:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:
        return  # not a call on this architecture
    array = (_ArgCmp * len(cmps))(*cmps) if cmps else None
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
    if rc < 0:
        raise SandboxError(f"libseccomp refused the rule for {name}: {os.strerror(-rc)}")


@functools.cache
def seccomp_filter() -> bytes:
    """The filter as a BPF program (what ``bwrap --seccomp FD`` reads), built once."""
    lib = _library()
    ctx = lib.seccomp_init(_errno(errno.ENOSYS))
    if not ctx:
        raise SandboxError("libseccomp could not start a filter (seccomp_init failed)")
    try:
        for name in _ALLOWED:
            if name not in DENIED:
                _rule(lib, ctx, _ACT_ALLOW, name)
        for name in DENIED:
            _rule(lib, ctx, _errno(errno.EPERM), name)
        no_namespaces = _ArgCmp(0, _CMP_MASKED_EQ, _NAMESPACE_FLAGS, 0)
        _rule(lib, ctx, _ACT_ALLOW, "clone", no_namespaces)  # clone3: the default, ENOSYS
        fd = os.memfd_create("seccomp")
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
            if rc < 0:
                raise SandboxError(f"libseccomp could not export the filter: {os.strerror(-rc)}")
            size = os.lseek(fd, 0, os.SEEK_END)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def docker_profile() -> str:
    """The same filter as a Docker/podman seccomp profile (JSON, for ``security_opt``)."""
    rules = [
        {"names": [n for n in _ALLOWED if n not in DENIED], "action": "SCMP_ACT_ALLOW"},
        {"names": list(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [
                {"index": 0, "value": _NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
            ],
        },
    ]
    return json.dumps(
        {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": errno.ENOSYS, "syscalls": rules}
    )
