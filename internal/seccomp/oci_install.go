package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// InstallProgram installs a filter compiled by CompileOCI (program and
// flags) on the calling thread only (no TSYNC): the caller holds the
// thread (runtime.LockOSThread) and execs from it, and the program it
// execs keeps the filter. Without no_new_privs the thread needs
// CAP_SYS_ADMIN.
func InstallProgram(program []byte, flags uint32) error {
	if len(program) == 0 || len(program)%8 != 0 || len(program)/8 > maxInstructions {
		return fmt.Errorf("seccomp: a program of %d bytes: want 1 to %d instructions of 8 bytes", len(program), maxInstructions)
	}
	prog := make([]unix.SockFilter, len(program)/8)
	for i := range prog {
		b := program[8*i:]
		prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.NativeEndian.Uint32(b[4:])}
	}
	if flags&unix.SECCOMP_FILTER_FLAG_TSYNC != 0 {
		return fmt.Errorf("seccomp: flags %#x: TSYNC is not for a container's filter", flags)
	}
	if _, err := setFilter(uintptr(flags), prog); err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("seccomp: install the container's filter: %w (this kernel lacks CONFIG_SECCOMP_FILTER)", err)
		}
		return fmt.Errorf("seccomp: install the container's filter (%d instructions): %w", len(prog), err)
	}
	return nil
}
