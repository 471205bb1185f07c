package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// InNetNS runs fn in the network namespace at path (a file under
// /var/run/netns, made by the test) on a thread of its own, which is
// thrown away afterwards: sockets fn opens stay in that namespace, and no
// other goroutine ever runs in it.
func InNetNS(path string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err != nil {
			done <- fmt.Errorf("enter %s: %w", path, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// NewNetNS makes a network namespace for the test, named prefix and the
// process ID, and returns its name (its path is /var/run/netns/NAME); it
// is deleted when the test ends. Without root or iproute2's ip the test
// is skipped.
func NewNetNS(tb testing.TB, prefix string) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root for a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs iproute2's ip for a named network namespace")
	}
	ns := fmt.Sprintf("%s%d", prefix, os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	tb.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	return ns
}
