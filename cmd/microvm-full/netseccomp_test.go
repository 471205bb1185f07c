package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// envExecNetNS marks the child TestExecNetSeccomp re-executes itself as, in
// a network namespace of its own.
const envExecNetNS = "MICROVM_EXEC_NET_TEST_IN_NETNS"

// TestExecNetSeccomp runs `microvm exec --net tap=...` as its own process,
// so with the seccomp filter on (the default), and has Linux's virtio-net
// driver bring eth0 up (the guest's offloads reach the TAP through
// TUNSETOFFLOAD after the filter is in) and ping the host through the TAP:
// frames both ways under the filter. TestNetLinux does the heavy traffic
// through the Go API, which installs no filter. It needs root (a network
// namespace and a TAP) and a KVM that runs Linux.
func TestExecNetSeccomp(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	const busybox = "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	if os.Getenv(envExecNetNS) != "1" {
		if os.Geteuid() != 0 {
			testenv.Missing(t, "needs root for a network namespace and a TAP")
		}
		timeout := 5 * time.Minute
		if d, ok := t.Deadline(); ok {
			timeout = min(timeout, time.Until(d)-30*time.Second)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestExecNetSeccomp$", "-test.v", "-test.timeout="+timeout.String())
		cmd.Env = append(os.Environ(), envExecNetNS+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		out, err := cmd.CombinedOutput()
		t.Logf("in the network namespace:\n%s", out)
		if err != nil {
			t.Fatalf("the test in its network namespace: %v", err)
		}
		return
	}

	const tap, hostAddr = "mvsec0", "10.98.0.1"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(busybox, append([]string{"ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("link", "set", "lo", "up")
	// The guest tries for two minutes by its clock (a ping without an ARP
	// answer takes 3 s, so a count of tries could outlast --timeout): the
	// host configures its end of the TAP only once microvm has made it.
	// On failure it prints its interface counters and neighbours, which
	// tell a frame the host never answered from one the guest never got.
	script := "ip addr add 10.98.0.2/24 dev eth0 && ip link set eth0 up && end=$(($(date +%s)+120)); " +
		"while [ $(date +%s) -lt $end ]; do ping -c 1 -W 1 " + hostAddr + " >/dev/null 2>&1 && echo pinged && exit 0; done; " +
		"echo no reply; cat /proc/net/dev; ip neigh; exit 1"
	vm := exec.Command(testenv.Binary(t), "exec", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t),
		"--net", "tap="+tap+",mac=02:00:00:98:00:02", "--timeout", "3m", "--log-level", "debug",
		"--", "sh", "-c", script)
	var stdout, stderr bytes.Buffer
	vm.Stdout, vm.Stderr = &stdout, &stderr
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- vm.Wait() }()
	configured := false
	for !configured {
		select {
		case err := <-done:
			t.Fatalf("microvm exec ended (%v) before its TAP appeared\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
		case <-time.After(100 * time.Millisecond):
		}
		// Not /sys/class/net: sysfs shows the namespace of whoever
		// mounted it, and this one is new.
		if _, err := net.InterfaceByName(tap); err == nil {
			ip("addr", "add", hostAddr+"/24", "dev", tap)
			ip("link", "set", tap, "up")
			configured = true
		}
	}
	err := <-done
	if err != nil || !strings.Contains(stdout.String(), "pinged") {
		t.Fatalf("microvm exec: %v; want status 0 and a reply to the guest's ping\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	if !strings.Contains(stderr.String(), "seccomp: filter installed") {
		t.Errorf("the filter was not installed (no debug line saying so):\n%s", &stderr)
	}
}
