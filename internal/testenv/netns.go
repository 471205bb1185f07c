package testenv

import (
	"fmt"
	"runtime"

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
