package seccomp

import "strconv"

//go:generate go run gen_names.go

// Name is the name of system call nr on this architecture ("openat"), or
// "syscall N" for a number the table does not know.
func Name(nr int) string {
	if nr >= 0 && nr < len(syscallNames) && syscallNames[nr] != "" {
		return syscallNames[nr]
	}
	return "syscall " + strconv.Itoa(nr)
}
