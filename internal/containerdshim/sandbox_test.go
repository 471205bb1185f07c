package containerdshim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// A guest that ends before its agent answers (the test guest: it prints a
// line and leaves through the debug port) fails the boot with how the VM
// ended and its console, and leaves no VM and no initramfs behind.
func TestBootSandboxGuestEnds(t *testing.T) {
	guest := testenv.TestGuest(t)
	testenv.RequireKVM(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "root.ext4")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Kernel: guest, Agent: testenv.Agent(t), CPUs: 1, Memory: 64 << 20, BootTimeout: time.Minute}
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	_, err := bootSandbox(context.Background(), cfg, dir, disk, "", "", log)
	if err == nil {
		t.Fatal("boot of a guest without an agent succeeded")
	}
	if !strings.Contains(err.Error(), "the VM ended before its agent answered") || !strings.Contains(err.Error(), "testguest") {
		t.Errorf("error %q: want the VM's end and its console", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, initrdFile)); !os.IsNotExist(serr) {
		t.Errorf("initramfs left: %v", serr)
	}
}

// A pod network namespace the shim cannot use (here: gone, as after a CNI
// DEL) fails the boot before any VM exists, naming the namespace, and
// leaves no initramfs behind.
func TestBootSandboxBadPodNetwork(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Kernel: "/nonexistent/bzImage", Agent: testenv.Agent(t), CPUs: 1, Memory: 64 << 20, BootTimeout: time.Minute}
	netns := filepath.Join(dir, "cni-gone")
	_, err := bootSandbox(context.Background(), cfg, dir, filepath.Join(dir, "root.ext4"), "", netns, logrus.New())
	if err == nil || !strings.Contains(err.Error(), "pod network") || !strings.Contains(err.Error(), netns) {
		t.Errorf("boot with a missing network namespace: %v, want a pod network error naming it", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, initrdFile)); !os.IsNotExist(serr) {
		t.Errorf("initramfs left: %v", serr)
	}
}

// A configuration error fails Create with its reason.
func TestCreateConfigError(t *testing.T) {
	s := &Service{cfgErr: os.ErrNotExist, containers: map[string]*container{}}
	_, err := s.Create(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "microvm shim configuration") {
		t.Errorf("Create with a bad configuration: %v", err)
	}
}
