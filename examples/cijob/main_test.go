package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestCIJob runs the example's job for real: a fresh VM, the script in,
// its output, the artifact out. It boots Linux, so it needs a KVM that can
// (natively on hardware KVM, otherwise in the nested-KVM box).
func TestCIJob(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	out := filepath.Join(t.TempDir(), "artifact.txt")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	status, err := runJob(ctx, testenv.BzImage(t), testenv.Agent(t), "/bin/busybox", out)
	if err != nil || status != 0 {
		t.Fatalf("runJob: status %d, %v", status, err)
	}
	b, err := os.ReadFile(out)
	if err != nil || string(b) != "sum 500500\n" {
		t.Errorf("artifact %q, %v; want \"sum 500500\\n\"", b, err)
	}
}
