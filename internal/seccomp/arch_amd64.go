package seccomp

import "golang.org/x/sys/unix"

// auditArch is the architecture the filter admits (seccomp_data.arch).
const auditArch = unix.AUDIT_ARCH_X86_64
