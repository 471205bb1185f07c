package named

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/consoletest"
	"github.com/microvm/microvm/internal/vms"
)

// TestLogs: Logs prints a VM's console log; with follow it prints what the
// console writes next and returns once the VM ends (its lease released),
// with what it wrote last; an unknown VM is an error.
func TestLogs(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		t.Fatal(err)
	}
	lease, err := store.Create(vms.Record{Name: "logvm"})
	if err != nil {
		t.Fatal(err)
	}
	console, err := vms.OpenConsoleLog(lease.Dir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	console.Write([]byte("booted\n"))

	var once bytes.Buffer
	if err := Logs(context.Background(), &once, "logvm", false); err != nil || once.String() != "booted\n" {
		t.Fatalf("Logs: %v, %q; want \"booted\\n\"", err, once.String())
	}

	followed := consoletest.New()
	done := make(chan error, 1)
	go func() { done <- Logs(context.Background(), followed, "logvm", true) }()
	console.Write([]byte("more\n"))
	if !followed.WaitFor("more\n", 10*time.Second, nil) {
		t.Fatalf("Logs -f never printed what the console wrote next: %q", followed.String())
	}
	console.Write([]byte("last words\n"))
	if err := lease.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if want := "booted\nmore\nlast words\n"; err != nil || followed.String() != want {
			t.Errorf("Logs -f: %v, %q; want %q", err, followed.String(), want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Logs -f did not return after the VM ended")
	}

	if err := Logs(context.Background(), &once, "nosuchvm", false); err == nil {
		t.Error("Logs of a VM that does not exist succeeded")
	}
}
