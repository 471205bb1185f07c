package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNeedCanRunOn(t *testing.T) {
	tests := []struct {
		need Need
		host HostKVM
		want bool
	}{
		{NeedKVM, KVMNone, false}, {NeedKVM, KVMPVM, true}, {NeedKVM, KVMHardware, true},
		{NeedInterrupts, KVMNone, false}, {NeedInterrupts, KVMPVM, false}, {NeedInterrupts, KVMHardware, true},
		{NeedLinux, KVMNone, false}, {NeedLinux, KVMPVM, false}, {NeedLinux, KVMHardware, true},
		{NeedKernelFPU, KVMNone, false}, {NeedKernelFPU, KVMPVM, false}, {NeedKernelFPU, KVMHardware, true},
	}
	for _, tc := range tests {
		if got := tc.need.canRunOn(tc.host); got != tc.want {
			t.Errorf("%s on %s: %v, want %v", tc.need.Layer(), tc.host, got, tc.want)
		}
	}
}

// TestRecordAndQueue: the lines scripts/box-test and scripts/test-summary
// read, with the package directory relative to the repository root.
func TestRecordAndQueue(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvTestRecord, dir)
	t.Setenv(EnvBoxQueueClosed, "")
	t.Run("sub", func(t *testing.T) {
		Record(t, "kvm", "native")
		if !queue(t, false) || !queue(t, true) {
			t.Fatal("queue: no queue although $MICROVM_TEST_RECORD is set")
		}
	})
	rec, err := os.ReadFile(filepath.Join(dir, "record.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(rec), "kvm native internal/testing/testenv TestRecordAndQueue\n"; got != want {
		t.Errorf("record.txt = %q, want %q", got, want)
	}
	q, err := os.ReadFile(filepath.Join(dir, "queue.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(q), "internal/testing/testenv TestRecordAndQueue\ninternal/testing/testenv TestRecordAndQueue alone\n"; got != want {
		t.Errorf("queue.txt = %q, want %q", got, want)
	}
	t.Setenv(EnvTestRecord, "")
	if queue(t, false) {
		t.Error("queue reported success with no $MICROVM_TEST_RECORD")
	}
}

// fatalTB records Fatalf instead of ending the test.
type fatalTB struct {
	*testing.T
	fatal string
}

func (f *fatalTB) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }

// TestQueueClosed: once the box read its queue (make test's go-test-rest),
// a test that would queue itself fails, naming itself, and queues nothing.
func TestQueueClosed(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvTestRecord, dir)
	t.Setenv(EnvBoxQueueClosed, "1")
	f := &fatalTB{T: t}
	if queue(f, false) {
		t.Error("queue reported success with the queue closed")
	}
	if !strings.Contains(f.fatal, "internal/testing/testenv TestQueueClosed would be queued") {
		t.Errorf("Fatalf %q, want one naming the test", f.fatal)
	}
	if _, err := os.Stat(filepath.Join(dir, "queue.txt")); !os.IsNotExist(err) {
		t.Errorf("queue.txt: %v, want none", err)
	}
}

func TestHostString(t *testing.T) {
	var names []string
	for _, h := range []HostKVM{KVMNone, KVMPVM, KVMHardware} {
		names = append(names, h.String())
	}
	if got := strings.Join(names, ","); got != "none,pvm,hardware" {
		t.Errorf("names %s; scripts/host-kvm prints none, pvm, hardware", got)
	}
}
