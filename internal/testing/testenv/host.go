package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// HostKVM is what this host's /dev/kvm can do.
type HostKVM int

const (
	// KVMNone: no /dev/kvm, or it cannot be opened.
	KVMNone HostKVM = iota
	// KVMPVM: a PVM-backed KVM (kvm_pvm): guest CPL3 runs natively, CPL0 is
	// emulated; the poll-mode test guest runs, guest interrupts and Linux
	// do not (docs/linux-on-pvm.md).
	KVMPVM
	// KVMHardware: KVM on hardware virtualization (including the nested
	// KVM inside the box): everything runs.
	KVMHardware
)

func (h HostKVM) String() string {
	switch h {
	case KVMPVM:
		return "pvm"
	case KVMHardware:
		return "hardware"
	}
	return "none"
}

// EnvHostKVM overrides the detected kind (none, pvm or hardware): a hardware
// host can pretend to be a PVM or KVM-less one, to exercise the box paths.
const EnvHostKVM = "MICROVM_HOST_KVM"

// EnvInBox is set to 1 inside the nested-KVM box (internal/testing/kvmbox).
const EnvInBox = "MICROVM_IN_BOX"

// EnvBoxQueueClosed, set (make test's go-test-rest sets it), says the box
// stage has read its queue already: a test that would queue itself fails
// instead of being left out of the box (scripts/test-packages).
const EnvBoxQueueClosed = "MICROVM_BOX_QUEUE_CLOSED"

// EnvTestRecord names a directory where tests record which layer ran where
// (record.txt) and which tests are left to the box (queue.txt); make test
// sets it, scripts/box-test runs the queue, scripts/test-summary reads both.
const EnvTestRecord = "MICROVM_TEST_RECORD"

var (
	hostOnce sync.Once
	hostKind HostKVM
)

// Host returns what this host's KVM can do, detected once: /dev/kvm that
// opens is PVM when the kvm_pvm module is loaded, hardware otherwise.
// $MICROVM_HOST_KVM can only lower the kind, never claim more than is there.
func Host() HostKVM {
	hostOnce.Do(func() {
		hostKind = detectHost()
		switch os.Getenv(EnvHostKVM) {
		case "none":
			hostKind = KVMNone
		case "pvm":
			hostKind = min(hostKind, KVMPVM)
		}
	})
	return hostKind
}

func detectHost() HostKVM {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return KVMNone
	}
	unix.Close(fd)
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return KVMPVM
	}
	return KVMHardware
}

// InBox reports whether the tests run inside the nested-KVM box.
func InBox() bool { return os.Getenv(EnvInBox) == "1" }

// Need is what a KVM test needs of the host's KVM.
type Need int

const (
	// NeedKVM: any KVM; the guest polls (the test guest, tiny guests).
	NeedKVM Need = iota
	// NeedInterrupts: the guest takes interrupts (PVM hosts cannot).
	NeedInterrupts
	// NeedLinux: a Linux guest under microvm (PVM hosts cannot).
	NeedLinux
	// NeedKernelFPU: a guest that runs x87 or SSE instructions in kernel
	// mode (CPL0), which a PVM host emulates and fails
	// (KVM_EXIT_INTERNAL_ERROR). Its layer is still "kvm".
	NeedKernelFPU
)

// String names what the Need asks of the host, for skip messages.
func (n Need) String() string {
	if n == NeedKernelFPU {
		return "FPU instructions at guest CPL0"
	}
	return n.Layer()
}

// Layer names the test layer a Need belongs to, as the summary prints it.
func (n Need) Layer() string {
	switch n {
	case NeedInterrupts:
		return "interrupts"
	case NeedLinux:
		return "linux-under-microvm"
	}
	return "kvm"
}

func (n Need) canRunOn(h HostKVM) bool {
	switch h {
	case KVMHardware:
		return true
	case KVMPVM:
		return n == NeedKVM
	}
	return false
}

// RequireKVM returns when this host's KVM can give the test what need says,
// and records that the test's layer ran here. Otherwise the test is skipped:
// when make test runs it (MICROVM_TEST_RECORD set) it is queued for the
// nested-KVM box, which runs it later in the same make test; a test that
// cannot run even in the box, or runs alone, is Missing (a failure under
// CI=true).
func RequireKVM(tb testing.TB, need ...Need) {
	tb.Helper()
	n := NeedKVM
	if len(need) > 0 {
		n = need[0]
	}
	requireKVM(tb, n, false)
}

// RequireKVMAlone is RequireKVM for a long test that, queued for the box,
// gets a fresh box of its own rather than sharing its package's: its
// minutes under TCG do not count against the other tests' -test.timeout,
// and a box it breaks takes only it down.
func RequireKVMAlone(tb testing.TB, n Need) {
	tb.Helper()
	requireKVM(tb, n, true)
}

func requireKVM(tb testing.TB, n Need, alone bool) {
	tb.Helper()
	h := Host()
	if n.canRunOn(h) {
		where := "native"
		if InBox() {
			where = "box"
		}
		Record(tb, n.Layer(), where)
		return
	}
	why := fmt.Sprintf("needs %s; this host's KVM is %q", n, h)
	if InBox() {
		Missing(tb, "%s even inside the nested-KVM box", why)
		return
	}
	if queue(tb, alone) {
		tb.Skipf("%s: queued for the nested-KVM box, which make test runs next", why)
	}
	Missing(tb, "%s: run it through make test, which runs it in the nested-KVM box, or under scripts/kvmbox", why)
}

// Record notes that tb ran in layer, where ("native" or "box"), for the
// summary make test prints. Without $MICROVM_TEST_RECORD it does nothing.
func Record(tb testing.TB, layer, where string) {
	appendLine(tb, "record.txt", fmt.Sprintf("%s %s %s %s", layer, where, packageDir(tb), topName(tb)))
}

// queue adds tb's top-level test to the box's queue ("DIR Test", or
// "DIR Test alone" for a box of its own: internal/testing/boxtest reads it); false
// when there is no queue (the test runs outside make test).
func queue(tb testing.TB, alone bool) bool {
	line := fmt.Sprintf("%s %s", packageDir(tb), topName(tb))
	if os.Getenv(EnvTestRecord) != "" && os.Getenv(EnvBoxQueueClosed) != "" {
		tb.Fatalf("%s would be queued for the nested-KVM box, but this package's tests run beside the box stage, after it read its queue: scripts/test-packages puts a package before the box when its test files call testenv.RequireKVM themselves", line)
		return false
	}
	if alone {
		line += " alone"
	}
	return appendLine(tb, "queue.txt", line)
}

var recordMu sync.Mutex

func appendLine(tb testing.TB, file, line string) bool {
	dir := os.Getenv(EnvTestRecord)
	if dir == "" {
		return false
	}
	recordMu.Lock()
	defer recordMu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("test record: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatalf("test record: %v", err)
	}
	defer f.Close()
	// One write of a short line: O_APPEND keeps lines from several test
	// processes whole.
	if _, err := f.WriteString(line + "\n"); err != nil {
		tb.Fatalf("test record: %v", err)
	}
	return true
}

// topName is the top-level test's name: the box runs whole tests.
func topName(tb testing.TB) string {
	name, _, _ := strings.Cut(tb.Name(), "/")
	return name
}

// packageDir is the test's package directory relative to the repository
// root ("." for the root package): go test runs a test binary there.
func packageDir(tb testing.TB) string {
	wd, err := os.Getwd()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	root, err := Root()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	rel, err := filepath.Rel(root, wd)
	if err != nil || strings.HasPrefix(rel, "..") {
		tb.Fatalf("test runs outside the repository (%s)", wd)
	}
	return rel
}
