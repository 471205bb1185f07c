// Command nettest is the guest side of the virtio-net Linux test
// (net_integration_test.go): UDP counting that busybox, whose nc has no
// UDP, cannot do. It is built static and added to the agent image.
//
//	nettest udp-recv PORT N TIMEOUT   print "ready", then "got K" after N datagrams or TIMEOUT
//	nettest udp-send HOST:PORT N SIZE  send N datagrams of SIZE bytes, each carrying its index
//	nettest udp-ask HOST:PORT MSG TIMEOUT  send MSG (again every 200 ms) until a reply comes; print it
//	nettest udp-echo PORT STOP TIMEOUT  echo every datagram back until one reads STOP (echoed too) or TIMEOUT
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
		return fmt.Errorf("usage: nettest udp-recv PORT N TIMEOUT | udp-send HOST:PORT N SIZE | udp-ask HOST:PORT MSG TIMEOUT | udp-echo PORT STOP TIMEOUT")
	}
	switch args[0] {
	case "udp-ask":
		return udpAsk(args[1], args[2], args[3])
	case "udp-echo":
		return udpEcho(args[1], args[2], args[3])
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

// udpAsk sends msg to addr until an answer comes, and prints it.
func udpAsk(addr, msg, timeout string) error {
	d, err := time.ParseDuration(timeout)
	if err != nil {
		return err
	}
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(d)
	buf := make([]byte, 65536)
	for time.Now().Before(deadline) {
		if _, err := c.Write([]byte(msg)); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		k, err := c.Read(buf)
		if err == nil {
			fmt.Printf("%s\n", buf[:k])
			return nil
		}
	}
	return fmt.Errorf("no answer from %s within %v", addr, d)
}

// udpEcho echoes datagrams on port until one reads stop.
func udpEcho(port, stop, timeout string) error {
	d, err := time.ParseDuration(timeout)
	if err != nil {
		return err
	}
	c, err := net.ListenPacket("udp4", ":"+port)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("echoing")
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 65536)
	for {
		k, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("udp-echo: %w", err)
		}
		if _, err := c.WriteTo(buf[:k], from); err != nil {
			return err
		}
		if string(buf[:k]) == stop {
			return nil
		}
	}
}
