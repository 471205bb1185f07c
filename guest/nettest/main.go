// Command nettest is the guest side of the virtio-net Linux test
// (net_integration_test.go): UDP counting that busybox, whose nc has no
// UDP, cannot do. It is built static and added to the agent image.
//
//	nettest udp-recv PORT N TIMEOUT   print "ready", then "got K" after N datagrams or TIMEOUT
//	nettest udp-send HOST:PORT N SIZE  send N datagrams of SIZE bytes, each carrying its index
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "nettest:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 4 {
		return fmt.Errorf("usage: nettest udp-recv PORT N TIMEOUT | udp-send HOST:PORT N SIZE")
	}
	n, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	switch args[0] {
	case "udp-recv":
		timeout, err := time.ParseDuration(args[3])
		if err != nil {
			return err
		}
		c, err := net.ListenPacket("udp4", ":"+args[1])
		if err != nil {
			return err
		}
		defer c.Close()
		if uc, ok := c.(*net.UDPConn); ok {
			// Root in the guest: past net.core.rmem_max, so a burst
			// that the device delivers whole is not dropped here.
			if rc, err := uc.SyscallConn(); err == nil {
				_ = rc.Control(func(fd uintptr) {
					_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
				})
			}
		}
		fmt.Println("ready")
		seen := map[uint32]bool{}
		buf := make([]byte, 65536)
		_ = c.SetReadDeadline(time.Now().Add(timeout))
		for len(seen) < n {
			k, _, err := c.ReadFrom(buf)
			if err != nil {
				break
			}
			if k >= 4 {
				seen[binary.BigEndian.Uint32(buf)] = true
			}
		}
		fmt.Printf("got %d\n", len(seen))
		return nil
	case "udp-send":
		size, err := strconv.Atoi(args[3])
		if err != nil || size < 4 {
			return fmt.Errorf("size %q", args[3])
		}
		c, err := net.Dial("udp4", args[1])
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, size)
		for i := 0; i < n; i++ {
			binary.BigEndian.PutUint32(buf, uint32(i))
			for {
				_, err := c.Write(buf)
				if errors.Is(err, syscall.ENOBUFS) {
					// The guest's own queue is full: not a loss on
					// the link; wait for it to drain.
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					return err
				}
				break
			}
		}
		return nil
	}
	return fmt.Errorf("unknown mode %q", args[0])
}
