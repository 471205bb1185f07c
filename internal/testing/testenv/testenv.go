// Package testenv finds what the KVM integration tests need — /dev/kvm, the
// bundled test guest, the Linux test kernel — and decides what happens when
// something is missing: outside CI the test is skipped with a message saying
// how to provide it; under CI=true it fails, because CI must run every layer.
//
// Every helper that can skip or fail takes a testing.TB so tests and
// benchmarks share it. vsock.go adds what the vsock tests, the conformance
// suite and the vsock benchmark program share: the host side of the
// Firecracker handshake, a goroutine-safe output buffer and the test guest's
// stats line. socket.go and faketb.go hold generic helpers: a short
// directory for Unix sockets, an HTTP client over one, Accept with a time
// limit, and a testing.TB that records failures. testenv imports
// vsock/vsocktest, so the tests of packages below it (eventfd, guestmem,
// virtio, vsock) cannot import testenv.
package testenv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Environment variables that override where artefacts are looked for.
const (
	// EnvTestGuest names a prebuilt test guest ELF.
	EnvTestGuest = "MICROVM_TESTGUEST"
	// EnvKernel names a Linux vmlinux to boot instead of build/kernel/vmlinux.
	EnvKernel = "MICROVM_KERNEL"
)

// InCI reports whether the tests run under CI (CI=true), where a missing
// prerequisite is a failure rather than a skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing skips tb, or fails it under CI, with the reason.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		tb.Fatalf("CI requires this test to run: %s", msg)
	}
	tb.Skip(msg)
}

var (
	rootOnce sync.Once
	root     string
	rootErr  error
)

// Root returns the repository root: the nearest directory above the working
// directory whose go.mod declares the microvm module.
func Root() (string, error) {
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = err
			return
		}
		for {
			b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
			if err == nil && bytes.HasPrefix(b, []byte("module github.com/microvm/microvm\n")) {
				root = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = fmt.Errorf("testenv: no microvm go.mod above the working directory")
				return
			}
			dir = parent
		}
	})
	return root, rootErr
}

var guestMu sync.Mutex // one make at a time within a process

// TestGuest returns the path of the bundled test guest (guest/testguest).
// $MICROVM_TESTGUEST wins. Otherwise it runs make for bin/testguest in the
// repository (a no-op when up to date, so edited guest sources are picked up),
// holding a file lock so parallel test binaries do not link the same file at
// once. Without gcc or make, an existing bin/testguest is used as it is.
func TestGuest(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(EnvTestGuest); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("$%s: %v", EnvTestGuest, err)
		}
		return p
	}
	r, err := Root()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	out := filepath.Join(r, "bin", "testguest")
	guestMu.Lock()
	defer guestMu.Unlock()
	if err := makeGuest(r, out); err != nil {
		if _, serr := os.Stat(out); serr == nil {
			tb.Logf("using existing %s: rebuilding it failed: %v", out, err)
			return out
		}
		Missing(tb, "no test guest: %v (run `make` first, or set $%s)", err, EnvTestGuest)
	}
	return out
}

func makeGuest(root, out string) error {
	if _, err := exec.LookPath("make"); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(root, "build"), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(root, "build", ".testguest.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	cmd := exec.Command("make", "-s", "-C", filepath.Join(root, "guest", "testguest"), "OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make test guest: %w: %s", err, bytes.TrimSpace(b))
	}
	return nil
}

// Kernel returns the Linux test kernel (build/kernel/vmlinux, built by `make
// kernel`), or $MICROVM_KERNEL. It skips (fails under CI) when absent.
func Kernel(tb testing.TB) string {
	tb.Helper()
	p := os.Getenv(EnvKernel)
	if p == "" {
		r, err := Root()
		if err != nil {
			tb.Fatalf("%v", err)
		}
		p = filepath.Join(r, "build", "kernel", "vmlinux")
	}
	if _, err := os.Stat(p); err != nil {
		Missing(tb, "no Linux test kernel: %v (run `make kernel`, or set $%s)", err, EnvKernel)
	}
	return p
}

// Program is a tiny x86-64 guest program, built instruction by instruction.
// It runs in 64-bit mode at CPL0 from the loader's ELF64 entry (identity-mapped
// low memory, interrupts off, no IDT). Methods append and return the program.
type Program []byte

// Print writes s to COM1's transmit register, one `out` per byte.
func (p Program) Print(s string) Program {
	p = append(p, 0x66, 0xba, 0xf8, 0x03) // mov dx, 0x3f8
	for i := 0; i < len(s); i++ {
		p = append(p, 0xb0, s[i], 0xee) // mov al, c; out dx, al
	}
	return p
}

// Exit writes status to the debug-exit port 0xf4.
func (p Program) Exit(status byte) Program {
	return append(p, 0xb0, status, 0xe6, 0xf4) // mov al, status; out 0xf4, al
}

// Reset asks the i8042 to pulse the reset line (command 0xfe to port 0x64).
func (p Program) Reset() Program {
	return append(p, 0xb0, 0xfe, 0xe6, 0x64) // mov al, 0xfe; out 0x64, al
}

// Out writes byte v to I/O port port.
func (p Program) Out(port uint16, v byte) Program {
	// mov dx, port; mov al, v; out dx, al
	return append(p, 0x66, 0xba, byte(port), byte(port>>8), 0xb0, v, 0xee)
}

// Halt halts forever (interrupts are off): only the VMM can end the guest.
func (p Program) Halt() Program {
	return append(p, 0xf4, 0xeb, 0xfd) // 1: hlt; jmp 1b
}

// UD2 raises #UD; with no IDT that escalates to a triple fault.
func (p Program) UD2() Program { return append(p, 0x0f, 0x0b) }

// Tiny guest ELF layout: one PT_LOAD segment at 1 MiB holding the headers
// and the code right after them.
const (
	tinyBase    = 0x10_0000
	elfHdrSize  = 64
	elfPhdrSize = 56
	tinyCodeOff = elfHdrSize + elfPhdrSize
)

// TinyELF returns an ELF64 x86-64 executable (no PVH note, so the loader
// enters it in 64-bit mode) that runs p.
func TinyELF(p Program) []byte {
	size := uint64(tinyCodeOff + len(p))
	b := make([]byte, tinyCodeOff, size)
	copy(b, "\x7fELF\x02\x01\x01") // ELFCLASS64, little-endian, version 1
	le := binary.LittleEndian
	le.PutUint16(b[16:], 2)  // ET_EXEC
	le.PutUint16(b[18:], 62) // EM_X86_64
	le.PutUint32(b[20:], 1)  // EV_CURRENT
	le.PutUint64(b[24:], tinyBase+tinyCodeOff)
	le.PutUint64(b[32:], elfHdrSize) // e_phoff
	le.PutUint16(b[52:], elfHdrSize)
	le.PutUint16(b[54:], elfPhdrSize)
	le.PutUint16(b[56:], 1) // e_phnum
	le.PutUint16(b[58:], 64)
	ph := elfHdrSize
	le.PutUint32(b[ph:], 1)   // PT_LOAD
	le.PutUint32(b[ph+4:], 5) // PF_R|PF_X
	le.PutUint64(b[ph+8:], 0) // p_offset
	le.PutUint64(b[ph+16:], tinyBase)
	le.PutUint64(b[ph+24:], tinyBase)
	le.PutUint64(b[ph+32:], size)
	le.PutUint64(b[ph+40:], size)
	le.PutUint64(b[ph+48:], 0x1000)
	return append(b, p...)
}

// TinyGuest writes TinyELF(p) to a file in tb's temporary directory and
// returns its path.
func TinyGuest(tb testing.TB, p Program) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "tiny.elf")
	if err := os.WriteFile(path, TinyELF(p), 0o644); err != nil {
		tb.Fatalf("%v", err)
	}
	return path
}

// Environment variables naming prebuilt artefacts, so tests run inside the
// nested-KVM box (where building is slow) use what make built on the host.
const (
	// EnvBinary names a built microvm binary (make: bin/microvm).
	EnvBinary = "MICROVM_BINARY"
	// EnvInitrd names the Linux test guest's initramfs with the Go /init
	// (make initramfs: build/linux/initramfs.cpio.gz).
	EnvInitrd = "MICROVM_INITRD"
	// EnvBzImage names a Linux bzImage (default build/kernel/bzImage).
	EnvBzImage = "MICROVM_BZIMAGE"
	// EnvAgent names a built guest agent (make: bin/microvm-agent).
	EnvAgent = "MICROVM_AGENT"
	// EnvExamples names the directory of the built examples (make
	// examples: build/examples).
	EnvExamples = "MICROVM_EXAMPLES"
	// EnvDebian names a directory holding Debian's cloud kernel as
	// vmlinuz and its initramfs as initramfs.cpio.gz (make debian-kernel:
	// build/debian).
	EnvDebian = "MICROVM_DEBIAN"
	// EnvNetTest names the static guest network helper (make
	// build/nettest: guest/nettest).
	EnvNetTest = "MICROVM_NETTEST"
	// EnvDebianImage names a Debian 12 root file system tarball (make
	// debian-image: build/images/debian-12.tar, built with mmdebstrap
	// from Debian's archive).
	EnvDebianImage = "MICROVM_DEBIAN_IMAGE"
	// EnvDebianBuildImage names the same with bash, git, gcc, make and
	// curl (make debian-build-image: build/images/debian-12-build.tar), a
	// CI job's image.
	EnvDebianBuildImage = "MICROVM_DEBIAN_BUILD_IMAGE"
	// EnvDebianDockerImage names the CI image with Docker (make
	// debian-docker-image: build/images/debian-12-docker.tar).
	EnvDebianDockerImage = "MICROVM_DEBIAN_DOCKER_IMAGE"
	// EnvShim names the built containerd shim (make:
	// bin/containerd-shim-microvm-v2).
	EnvShim = "MICROVM_SHIM"
	// EnvCrictl names crictl (make: build/tools/crictl, go install of
	// sigs.k8s.io/cri-tools at a pinned version).
	EnvCrictl = "MICROVM_CRICTL"
)

var buildMu sync.Mutex // one make at a time within a process

// Binary returns a microvm binary: $MICROVM_BINARY, else bin/microvm built
// by `make bin/microvm` (incremental) under a file lock.
func Binary(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvBinary, "bin/microvm", "bin/microvm")
}

// NetHelper returns microvm-net, the user-mode network's helper:
// $MICROVM_NET (what microvm itself looks at), else bin/microvm-net built
// by make under a file lock.
func NetHelper(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, "MICROVM_NET", "bin/microvm-net", "bin/microvm-net")
}

// Agent returns the static guest agent: $MICROVM_AGENT, else
// bin/microvm-agent built by `make bin/microvm-agent` under a file lock.
func Agent(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvAgent, "bin/microvm-agent", "bin/microvm-agent")
}

// Shim returns the containerd shim: $MICROVM_SHIM, else
// bin/containerd-shim-microvm-v2 built by make.
func Shim(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvShim, "bin/containerd-shim-microvm-v2", "bin/containerd-shim-microvm-v2")
}

// Crictl returns crictl: $MICROVM_CRICTL, else build/tools/crictl
// installed by make.
func Crictl(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvCrictl, "build/tools/crictl", "build/tools/crictl")
}

// NetTest returns the static guest network helper (guest/nettest, UDP
// that busybox's nc cannot do): $MICROVM_NETTEST, else build/nettest
// built by `make build/nettest`.
func NetTest(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvNetTest, "build/nettest", "build/nettest")
}

// DebianImage returns a Debian 12 (minbase) root file system as a
// tarball, for microvm image import --rootfs: $MICROVM_DEBIAN_IMAGE, else
// build/images/debian-12.tar built by `make debian-image`
// (scripts/debian-image, which needs Debian's archive: call it before
// RequireKVM, so that the host builds it for a test queued for the box).
func DebianImage(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvDebianImage, "build/images/debian-12.tar", "debian-image")
}

// DebianBuildImage returns Debian 12 with bash, git, gcc, make and curl
// as a root file system tarball (a CI job's image): $MICROVM_DEBIAN_BUILD_IMAGE,
// else build/images/debian-12-build.tar built by `make debian-build-image`.
// Call it before RequireKVM, as DebianImage.
func DebianBuildImage(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvDebianBuildImage, "build/images/debian-12-build.tar", "debian-build-image")
}

// DebianDockerImage returns the CI image with Docker (docker.io, git,
// build tools) as a root file system tarball: $MICROVM_DEBIAN_DOCKER_IMAGE,
// else build/images/debian-12-docker.tar built by `make
// debian-docker-image`. Call it before RequireKVM, as DebianImage.
func DebianDockerImage(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvDebianDockerImage, "build/images/debian-12-docker.tar", "debian-docker-image")
}

// Example returns the built example program name (build/examples/NAME,
// made by `make examples`), or $MICROVM_EXAMPLES/NAME.
func Example(tb testing.TB, name string) string {
	tb.Helper()
	if d := os.Getenv(EnvExamples); d != "" {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("$%s: %v", EnvExamples, err)
		}
		return p
	}
	return artefact(tb, "", "build/examples/"+name, "examples")
}

// Initrd returns the Linux test guest's initramfs (guest/init as /init):
// $MICROVM_INITRD, else build/linux/initramfs.cpio.gz built by `make
// initramfs` under a file lock.
func Initrd(tb testing.TB) string {
	tb.Helper()
	return artefact(tb, EnvInitrd, "build/linux/initramfs.cpio.gz", "initramfs")
}

// DebianKernel returns Debian's linux-image-cloud-amd64 kernel and an
// initramfs with guest/init and its virtio and vsock modules: the files in
// $MICROVM_DEBIAN, else in build/debian after `make debian-kernel` (which
// downloads the packages once with apt-get; scripts/debian-kernel). Inside
// the nested-KVM box, which has no network and builds slowly, it only
// uses what the host made. Missing when they cannot be had. Call it before
// RequireKVM, so that the host fetches what a queued test needs in the box.
func DebianKernel(tb testing.TB) (kernel, initrd string) {
	tb.Helper()
	dir := os.Getenv(EnvDebian)
	if dir == "" {
		r, err := Root()
		if err != nil {
			tb.Fatalf("%v", err)
		}
		dir = filepath.Join(r, "build", "debian")
		if !InBox() {
			buildMu.Lock()
			err := makeLocked(r, "debian-kernel")
			buildMu.Unlock()
			if err != nil {
				Missing(tb, "no Debian cloud kernel: %v", err)
				return "", ""
			}
		}
	}
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs.cpio.gz")
	for _, p := range []string{kernel, initrd} {
		if _, err := os.Stat(p); err != nil {
			Missing(tb, "no Debian cloud kernel: %v (run `make debian-kernel`, or set $%s)", err, EnvDebian)
			return "", ""
		}
	}
	return kernel, initrd
}

// BzImage returns the Linux test kernel's bzImage (build/kernel/bzImage,
// made by `make kernel`), or $MICROVM_BZIMAGE; Missing when absent.
func BzImage(tb testing.TB) string {
	tb.Helper()
	p := os.Getenv(EnvBzImage)
	if p == "" {
		r, err := Root()
		if err != nil {
			tb.Fatalf("%v", err)
		}
		p = filepath.Join(r, "build", "kernel", "bzImage")
	}
	if _, err := os.Stat(p); err != nil {
		Missing(tb, "no Linux test bzImage: %v (run `make kernel`, or set $%s)", err, EnvBzImage)
	}
	return p
}

// artefact returns $env when set, else rel in the repository after `make
// target` brought it up to date.
func artefact(tb testing.TB, env, rel, target string) string {
	tb.Helper()
	if p := os.Getenv(env); env != "" && p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("$%s: %v", env, err)
		}
		return p
	}
	r, err := Root()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	out := filepath.Join(r, rel)
	buildMu.Lock()
	defer buildMu.Unlock()
	if err := makeLocked(r, target); err != nil {
		if _, serr := os.Stat(out); serr == nil {
			tb.Logf("using existing %s: rebuilding it failed: %v", out, err)
			return out
		}
		Missing(tb, "no %s: %v (run `make %s`, or set $%s)", rel, err, target, env)
	}
	return out
}

// makeLocked runs make target in the repository under build/.make.lock, so
// parallel test binaries do not write the same file at once.
func makeLocked(root, target string) error {
	if _, err := exec.LookPath("make"); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(root, "build"), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(root, "build", ".make.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	cmd := exec.Command("make", "-s", "-C", root, target)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make %s: %w: %s", target, err, bytes.TrimSpace(b))
	}
	return nil
}
