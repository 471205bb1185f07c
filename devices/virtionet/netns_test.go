package virtionet

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
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
	ns := testenv.NewNetNS(t, "vntest")
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
