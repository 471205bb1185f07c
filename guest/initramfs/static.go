package initramfs

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
)

// ErrNotStatic is returned for an executable that needs a dynamic loader
// (it has a PT_INTERP program header): an initramfs has none.
var ErrNotStatic = errors.New("dynamically linked (has PT_INTERP); build it with CGO_ENABLED=0")

// CheckStaticELF refuses anything but a statically linked x86-64 ELF
// executable: what /init, the agent and busybox must be in a guest image.
func CheckStaticELF(p string) error {
	// A file that is missing or cannot be opened says so, rather than
	// being called "not an ELF executable".
	if fi, err := os.Stat(p); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("%s: %w", p, err)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", p)
	}
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: not an ELF executable: %w", p, err)
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s: is %v %v, want a 64-bit x86-64 executable", p, f.Class, f.Machine)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s: %w", p, ErrNotStatic)
		}
	}
	return nil
}
