// Package seccomp confines a microvm process to the system calls it needs
// once its machine is built, with a seccomp filter written here in classic
// BPF (no libseccomp, no cgo).
//
// Data flow:
//
//	Policy (VMM, VhostUserVsock: rules, some with argument conditions)
//	  -> compile: arch check, x32 check, one compare per rule, default deny
//	  -> Install: report table and SIGSYS handler, no_new_privs,
//	     seccomp(SET_MODE_FILTER, TSYNC)
//	  -> every system call of every thread runs the filter in the kernel:
//	     allowed -> runs; clone3 -> ENOSYS; anything else -> SECCOMP_RET_TRAP
//	  -> the call does not run; SIGSYS on the calling thread -> sigsysHandler
//	     (assembly): the line for siginfo's call number to stderr,
//	     exit_group(ExitStatus)
//
// One allow-list covers the whole process, not one per kind of thread: Go
// moves goroutines between threads (only vCPU goroutines are locked to
// theirs), so the runtime's needs and every device's needs meet on every
// thread. Argument conditions narrow the riskiest calls: ioctl only with
// the requests in use (KVM_RUN, KVM_SET_GSI_ROUTING, KVM_GET_REGS,
// KVM_GET_SREGS and a few non-KVM ones), clone only with the flags Go
// creates threads with (no fork, no vfork), socket only in AF_UNIX, mmap
// and mprotect never executable, signals only to the process itself,
// prctl only to name mappings.
//
// Why a SIGSYS handler of our own: SECCOMP_RET_KILL_PROCESS kills without a
// word (at most an audit record in the kernel log). SECCOMP_RET_TRAP left to
// the Go runtime gives its crash report, "SIGSYS: bad system call" and a
// goroutine dump, where the call's number is only rax in the register dump.
// A user-notification listener read by a goroutine can name the call, but
// that goroutine needs a P to run after its read returns, and the thread
// stuck in the forbidden call may hold one: with GOMAXPROCS=1 (a VMM in a
// one-CPU cgroup) a forbidden call made through RawSyscall (socket(2) is)
// would hang the process instead of ending it. The handler here runs on
// the faulting thread itself, on its signal stack, needs nothing from the
// Go scheduler, and so works for any thread, runtime threads included. It
// is the package's only assembly (sigsys_amd64.s, about twenty
// instructions): Go has no way to install a signal handler that is not the
// runtime's otherwise. It reads only siginfo and a table of lines written
// before the filter went in, and makes only allowed calls (write,
// exit_group).
//
// Goroutines: none. Install holds its calling goroutine's thread
// (LockOSThread) while setting no_new_privs and the filter, both
// per-thread states that TSYNC then copies to every other thread.
//
// Kernel layouts (seccomp_data, sock_filter, sock_fprog, the rt_sigaction
// struct sigaction, siginfo's SIGSYS fields) are mirrored in bpf.go and
// sigaction.go and checked in layout_unsafe_test.go; only sys_unsafe.go
// passes pointers to the kernel.
// names_amd64.go, the system call names reports show, is generated
// (go generate; gen_names.go).
package seccomp
