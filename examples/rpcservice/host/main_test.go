package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestGreeter boots the example's VM, starts the user's gRPC service in it
// through the agent and calls it over DialVsock.
func TestGreeter(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var shown bytes.Buffer
	r, err := run(ctx, testenv.BzImage(t), testenv.Agent(t), testenv.Example(t, "greeterd"), "/bin/busybox", &shown)
	if err != nil {
		t.Fatal(err)
	}
	if r.Message != "hello, host, from inside the VM" || r.Kernel == "" {
		t.Errorf("reply %+v", r)
	}
	// What make run shows: uname -a's line and the script's three.
	out := shown.String()
	for _, want := range []string{"Linux ", "guest: 2 CPUs", "guest: mounted: ", "pid 1 is init"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q:\n%s", want, out)
		}
	}
}
