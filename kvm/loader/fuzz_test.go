package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/microvm/microvm/kvm/guestmem"
)

// fuzzMem is shared by fuzz iterations (one process runs them one at a
// time; the mutex keeps -race and parallel seeds honest).
var (
	fuzzMu  sync.Mutex
	fuzzMem *guestmem.Memory
)

// fuzzSeeds are the synthetic kernels the seed corpus in testdata/fuzz holds.
func fuzzSeeds() map[string][]byte {
	bz := defaultBz()
	bz.kernelLen = 512
	bz.initSize = 64 << 10
	pvh := defaultPVH()
	pvh.segs[0].data = pattern(256, 1)
	pvh.segs[0].memsz = 512
	pvh.notes = pvhNote(0x1000010)
	pvh32 := pvh
	pvh32.class32 = true
	pvhSh := pvh
	pvhSh.notePhdr, pvhSh.noteShdr = false, true
	vmlinux := pvh
	vmlinux.notes, vmlinux.notePhdr, vmlinux.entry = nil, false, 0x1000000
	return map[string][]byte{
		"bzimage":      makeBzImage(bz),
		"pvh-elf64":    makeELF(pvh),
		"pvh-elf32":    makeELF(pvh32),
		"pvh-sections": makeELF(pvhSh),
		"vmlinux":      makeELF(vmlinux),
	}
}

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzLoadKernel when
// LOADER_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("LOADER_WRITE_SEEDS") != "1" {
		t.Skip("set LOADER_WRITE_SEEDS=1 to rewrite the fuzz seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzLoadKernel")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range fuzzSeeds() {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzLoadKernel: no kernel file may crash Load, every error is one line
// naming the file (the kernel, or the initrd that does not fit in the room
// the kernel leaves), and a successful load enters inside the kernel.
func FuzzLoadKernel(f *testing.F) {
	for _, b := range fuzzSeeds() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzMu.Lock()
		defer fuzzMu.Unlock()
		if fuzzMem == nil {
			fuzzMem = newMem(t, 32*mib)
		}
		rd := BytesImage("initrd", []byte("070701"))
		b, err := Load(fuzzMem, Config{Kernel: BytesImage("fuzz", data), Initrd: &rd, Cmdline: "console=ttyS0", CPUs: 2})
		if err != nil {
			// The file named is the kernel, or the initrd when it does not
			// fit where the kernel leaves room (init_size and
			// initrd_addr_max are the kernel's to choose).
			msg := err.Error()
			named := strings.HasPrefix(msg, "kernel fuzz: ") ||
				strings.HasPrefix(msg, "initrd initrd (") && errors.Is(err, ErrTooBig)
			if !named || strings.Contains(msg, "\n") {
				t.Fatalf("error %q is not one line naming the file", msg)
			}
			return
		}
		if b.RIP < b.Kernel.GPA || b.RIP >= b.Kernel.End() {
			t.Fatalf("entry %#x outside the kernel %#x+%#x", b.RIP, b.Kernel.GPA, b.Kernel.Size)
		}
		if b.Initrd.GPA < b.Kernel.End() || b.Initrd.End() > 32*mib {
			t.Fatalf("initrd %#x+%#x overlaps the kernel or leaves RAM", b.Initrd.GPA, b.Initrd.Size)
		}
	})
}

// FuzzScanNotes: the note walker never panics or loops on any block.
func FuzzScanNotes(f *testing.F) {
	f.Add(pvhNote(0x1000000), uint64(4))
	f.Add(append(note("GNU", 5, pattern(4, 0), 8), note("Xen", 18, pattern(8, 0), 8)...), uint64(8))
	f.Fuzz(func(t *testing.T, b []byte, align uint64) {
		v, ok, err := scanNotes(b, align)
		if ok && (err != nil || v >= fourGiB) {
			t.Fatalf("entry %#x, ok with error %v", v, err)
		}
	})
}
