package snapshot

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mincore is mincore(2): vec[i] bit 0 says whether page i of mem is
// resident (for a file mapping: in the page cache).
func mincore(mem, vec []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(mem))), uintptr(len(mem)),
		uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
	if errno != 0 {
		return errno
	}
	return nil
}
