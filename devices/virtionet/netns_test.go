package virtionet

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestOpenTAPIn creates a TAP inside a network namespace the test made
// (root only): it appears there and not in the test's own namespace, it
// goes when its descriptor closes, and a namespace that does not exist is
// an error naming it.
func TestOpenTAPIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace and a TAP")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no TUN/TAP: %v", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip for a named network namespace")
	}
	ns := fmt.Sprintf("vntest%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	links := func() string {
		out, err := exec.Command("ip", "-n", ns, "-o", "link").CombinedOutput()
		if err != nil {
			t.Fatalf("ip -n %s link: %v\n%s", ns, err, out)
		}
		return string(out)
	}

	tap, err := OpenTAPIn("vnnstap0", "/var/run/netns/"+ns)
	if err != nil {
		t.Fatal(err)
	}
	if l := links(); !strings.Contains(l, "vnnstap0") {
		t.Errorf("the TAP is not in the namespace:\n%s", l)
	}
	if _, err := net.InterfaceByName("vnnstap0"); err == nil {
		t.Errorf("the TAP is in the test's own namespace too")
	}
	tap.Close()
	if l := links(); strings.Contains(l, "vnnstap0") {
		t.Errorf("the TAP outlived its descriptor:\n%s", l)
	}

	_, err = OpenTAPIn("vnnstap0", "/var/run/netns/"+ns+"-none")
	if err == nil || !strings.Contains(err.Error(), ns+"-none") {
		t.Errorf("a namespace that does not exist: %v, want an error naming it", err)
	}
}
