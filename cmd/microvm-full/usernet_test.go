package main

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestExecUserNet runs `microvm exec --net user,host-loopback` with
// Linux's virtio-net driver, as its own process (so under the seccomp
// filter), without root: the kernel takes its address by DHCP, the
// stack's DNS answers host.microvm.internal, the guest fetches a file from
// a server on this machine's loopback (HostIP, which host-loopback opens)
// and checks its SHA-256, asks a host UDP echo server, and serves HTTP and
// UDP echo that the host reaches through --publish. Nothing leaves the
// machine, no DNS question either.
func TestExecUserNet(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	nettest := testenv.NetTest(t)

	body := make([]byte, 1<<20)
	rand.Read(body)
	sum := sha256.Sum256(body)
	web, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) })}
	go srv.Serve(web)
	defer srv.Close()
	echo, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		b := make([]byte, 2048)
		for {
			k, a, err := echo.ReadFrom(b)
			if err != nil {
				return
			}
			echo.WriteTo(append([]byte("host got "), b[:k]...), a)
		}
	}()
	tcpPub, udpPub := testenv.FreePort(t, "tcp"), testenv.FreePort(t, "udp")

	script := strings.Join([]string{
		"set -e",
		"ip addr show eth0",
		"cat /etc/resolv.conf",
		// A alone: an AAAA question would go on to the host's resolver
		// (the stack answers only A from its records), and so may a name
		// wget resolves (glibc asks for both).
		"nslookup -type=a host.microvm.internal",
		fmt.Sprintf("wget -q -O /tmp/f http://192.168.127.254:%d/file", web.Addr().(*net.TCPAddr).Port),
		"sha256sum /tmp/f",
		fmt.Sprintf("/bin/nettest udp-ask 192.168.127.254:%d ping-from-guest 20s", echo.LocalAddr().(*net.UDPAddr).Port),
		"mkdir -p /www && echo served-by-guest > /www/index.html && httpd -p 8080 -h /www",
		"echo SERVING",
		"/bin/nettest udp-echo 7000 bye 120s",
	}, "\n")
	vm := exec.Command(testenv.Binary(t), "exec", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t),
		"--add", nettest+":/bin/nettest", "--net", "user,host-loopback",
		"--publish", fmt.Sprintf("%d:8080", tcpPub), "--publish", fmt.Sprintf("%d:7000/udp", udpPub),
		"--timeout", "4m", "--", "sh", "-c", script)
	stdout, err := vm.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	vm.Stderr = &stderr
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	defer vm.Process.Kill()
	var out strings.Builder
	var outMu sync.Mutex
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			outMu.Lock()
			out.WriteString(sc.Text() + "\n")
			outMu.Unlock()
			if sc.Text() == "SERVING" {
				close(serving)
			}
		}
	}()
	output := func() string { outMu.Lock(); defer outMu.Unlock(); return out.String() }
	select {
	case <-serving:
	case <-time.After(4 * time.Minute):
		t.Fatalf("the guest did not get to serving\nstdout:\n%s\nstderr:\n%s", output(), &stderr)
	}

	// Host to guest, TCP: the published port reaches the guest's httpd.
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", tcpPub))
	if err != nil {
		t.Fatalf("GET through --publish: %v\nstdout:\n%s\nstderr:\n%s", err, output(), &stderr)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(page)) != "served-by-guest" {
		t.Errorf("GET through --publish: %q, want served-by-guest", page)
	}
	// Host to guest, UDP: the published port reaches the guest's echo
	// server (which may not be listening yet: ask again until it is).
	c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", udpPub))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reply := make([]byte, 2048)
	got := ""
	for deadline := time.Now().Add(time.Minute); got == "" && time.Now().Before(deadline); {
		c.Write([]byte("ping-from-host"))
		c.SetReadDeadline(time.Now().Add(time.Second))
		if k, err := c.Read(reply); err == nil {
			got = string(reply[:k])
		}
	}
	if got != "ping-from-host" {
		t.Errorf("UDP through --publish: %q, want the echo of ping-from-host", got)
	}
	for i := 0; i < 5; i++ {
		c.Write([]byte("bye"))
		time.Sleep(100 * time.Millisecond)
	}
	done := make(chan error, 1)
	go func() { done <- vm.Wait() }()
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("exec did not end after bye\nstdout:\n%s\nstderr:\n%s", output(), &stderr)
	}
	o := output()
	t.Logf("guest:\n%s", o)
	if err != nil {
		t.Fatalf("exec: %v\nstderr:\n%s", err, &stderr)
	}
	for _, want := range []string{
		"inet 192.168.127.2/24",    // DHCP's lease
		"nameserver 192.168.127.1", // the kernel's /proc/net/pnp, linked by the agent
		"192.168.127.254",          // nslookup of host.microvm.internal
		hex.EncodeToString(sum[:]), // the file arrived whole
		"host got ping-from-guest", // UDP guest to host and back
	} {
		if !strings.Contains(o, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
}
