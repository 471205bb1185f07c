package virtionet

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// OpenTAPIn is OpenTAP inside the network namespace at nsPath (a file such
// as /var/run/netns/NAME or /proc/PID/ns/net): TUNSETIFF creates, or finds,
// the interface in the namespace of the thread that calls it, and the
// descriptor keeps working from any namespace afterwards. "" is OpenTAP in
// the caller's own namespace.
//
// The open runs on a goroutine of its own, locked to its OS thread, which
// enters the namespace and is never unlocked: Go ends that thread with the
// goroutine, so no other goroutine ever runs in the pod's namespace.
func OpenTAPIn(name, nsPath string) (*TAP, error) {
	if nsPath == "" {
		return OpenTAP(name)
	}
	type result struct {
		t   *TAP
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: fmt.Errorf("virtio-net: network namespace %s: %w", nsPath, err)}
			return
		}
		err = unix.Setns(ns, unix.CLONE_NEWNET)
		unix.Close(ns)
		if err != nil {
			ch <- result{err: fmt.Errorf("virtio-net: enter network namespace %s: %w", nsPath, err)}
			return
		}
		t, err := OpenTAP(name)
		ch <- result{t, err}
	}()
	r := <-ch
	return r.t, r.err
}
