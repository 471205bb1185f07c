package microvm_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/internal/testing/consoletest"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// envNetNS marks the child process TestNetLinux re-executes itself as, in
// a network namespace of its own.
const envNetNS = "MICROVM_NET_TEST_IN_NETNS"

// Addresses on the test's TAP link.
const (
	netTAP     = "mvtest0"
	netHostIP  = "10.99.0.1"
	netGuestIP = "10.99.0.2"
	netMAC     = "02:00:00:99:00:02"
	netBulk    = 64 << 20 // bytes each way over TCP
	netUDP     = 1000     // datagrams each way
)

// TestNetLinux runs Linux's virtio-net driver against the device on a TAP
// in a network namespace made for the test: ping both ways, 64 MiB over TCP
// each way with matching SHA-256 (busybox nc in the guest), and 1000 UDP
// datagrams each way with none lost. It needs root (the namespace and the
// TAP) and a KVM that runs Linux: in the nested-KVM box on other hosts,
// where it takes a box of its own (a few minutes under TCG).
func TestNetLinux(t *testing.T) {
	testenv.RequireKVMAlone(t, testenv.NeedLinux)
	if os.Getenv(envNetNS) != "1" {
		if os.Geteuid() != 0 {
			testenv.Missing(t, "needs root for a network namespace and a TAP")
		}
		// The whole test runs in a child process cloned into a new
		// network namespace: every thread of it is there, and the TAP
		// and addresses vanish with it. The child's -test.timeout ends
		// before this test's, so a hung child dumps its goroutines and
		// this test still reports; a child that then cannot exit (seen
		// once in an old box run, stuck in its exit) is given up on.
		childTimeout, giveUp := 14*time.Minute, 15*time.Minute
		if d, ok := t.Deadline(); ok {
			left := time.Until(d)
			childTimeout, giveUp = left-90*time.Second, left-45*time.Second
			if childTimeout < time.Minute {
				t.Fatalf("only %v left before -test.timeout: too little for the test", left.Round(time.Second))
			}
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestNetLinux$", "-test.v", "-test.timeout="+childTimeout.String())
		cmd.Env = append(os.Environ(), envNetNS+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		out := &testenv.SyncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			t.Logf("in the network namespace:\n%s", out.String())
			if err != nil {
				t.Fatalf("the test in its network namespace: %v", err)
			}
		case <-time.After(giveUp):
			_ = cmd.Process.Kill()
			t.Fatalf("the test in its network namespace has not exited after %v; it printed:\n%s", giveUp.Round(time.Second), out.String())
		}
		return
	}
	busybox := "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	helper := netTestHelper(t)
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initramfs.cpio")
	f, err := os.Create(initrd)
	if err != nil {
		t.Fatal(err)
	}
	err = agentimage.Build(f, agentimage.Options{Agent: testenv.Agent(t), Busybox: busybox,
		Files: []agentimage.File{{Src: helper, Dst: "/bin/nettest"}}})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	hostIP(t, busybox, "link", "set", "lo", "up")
	mac, _ := net.ParseMAC(netMAC)
	log, logged := logBuffer()
	cons := consoletest.New()
	m, err := microvm.New(microvm.Config{
		Kernel: testenv.BzImage(t), Initrd: initrd, CPUs: 2, MemoryBytes: 768 << 20,
		Cmdline: "console=ttyS0 reboot=k panic=-1 quiet",
		Console: cons, Log: log,
		Vsock: &microvm.VsockConfig{CID: 3, UDSPath: filepath.Join(dir, "v.sock")},
		Nets:  []microvm.NetConfig{{TAP: netTAP, MAC: mac}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// The TAP exists now (microvm created it); the host side is ours.
	hostIP(t, busybox, "addr", "add", netHostIP+"/24", "dev", netTAP)
	hostIP(t, busybox, "link", "set", netTAP, "qlen", "4096")
	hostIP(t, busybox, "link", "set", netTAP, "up")

	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	vmCtx, stopVM := context.WithCancel(ctx)
	vmDone := make(chan error, 1)
	go func() { _, err := m.Run(vmCtx); vmDone <- err }()
	defer func() {
		stopVM()
		<-vmDone
		t.Logf("device stats: %+v", m.NetStats(0))
		if t.Failed() {
			t.Logf("VMM log:\n%s\nconsole:\n%s", logged.String(), cons.String())
		}
	}()
	cc, err := agentapi.Connect(ctx, func(ctx context.Context) (net.Conn, error) { return m.DialVsock(ctx, 1024) })
	if err != nil {
		t.Fatalf("agent: %v", err)
	}
	defer cc.Close()
	g := &netGuest{t: t, ctx: ctx, c: agentapi.NewClient(cc)}

	g.sh("ip addr add " + netGuestIP + "/24 dev eth0 && ip link set eth0 up && ip addr show eth0")
	if s := g.sh("cat /sys/class/net/eth0/address"); strings.TrimSpace(s) != netMAC {
		t.Errorf("guest MAC %q, want %s", s, netMAC)
	}
	t.Run("ping", func(t *testing.T) {
		g.sh("ping -c 3 -W 10 " + netHostIP)
		if out, err := exec.Command(busybox, "ping", "-c", "3", "-W", "10", netGuestIP).CombinedOutput(); err != nil {
			t.Fatalf("host ping: %v\n%s", err, out)
		}
	})

	data := make([]byte, netBulk)
	rand.NewChaCha8([32]byte{1}).Read(data)
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	t.Run("tcp guest to host", func(t *testing.T) {
		if _, err := g.c.PutFile(ctx, "/tmp/data", 0o644, true, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp4", netHostIP+":5001")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		got := make(chan string, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				got <- err.Error()
				return
			}
			defer c.Close()
			h := sha256.New()
			n, err := io.Copy(h, c)
			got <- fmt.Sprintf("%x %d %v", h.Sum(nil), n, err)
		}()
		start := time.Now()
		g.sh("nc " + netHostIP + " 5001 < /tmp/data && rm /tmp/data")
		if r := <-got; r != fmt.Sprintf("%s %d <nil>", want, netBulk) {
			t.Fatalf("host received %q, want %s %d", r, want, netBulk)
		}
		t.Logf("64 MiB guest to host in %v", time.Since(start).Round(time.Millisecond))
	})
	t.Run("tcp host to guest", func(t *testing.T) {
		res := make(chan string, 1)
		go func() { res <- g.shErr("nc -l -p 5002 | sha256sum") }()
		start := time.Now()
		var c net.Conn
		for {
			var err error
			c, err = net.DialTimeout("tcp4", netGuestIP+":5002", 5*time.Second)
			if err == nil {
				break
			}
			if time.Since(start) > time.Minute {
				t.Fatalf("dial the guest's nc: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := c.Write(data); err != nil {
			t.Fatalf("write: %v", err)
		}
		c.Close()
		if out := <-res; !strings.HasPrefix(out, want+" ") {
			t.Fatalf("guest sha256sum %q, want %s", out, want)
		}
		t.Logf("64 MiB host to guest in %v", time.Since(start).Round(time.Millisecond))
	})
	t.Run("udp host to guest", func(t *testing.T) {
		pr, pw := io.Pipe()
		res := make(chan string, 1)
		go func() {
			res <- g.run(&agentapi.Cmd{Argv: []string{"/bin/nettest", "udp-recv", "5003", fmt.Sprint(netUDP), "60s"}, Stdout: pw})
			pw.Close()
		}()
		sc := bufio.NewScanner(pr)
		if !sc.Scan() || sc.Text() != "ready" {
			t.Fatalf("guest receiver: %q", sc.Text())
		}
		c, err := net.Dial("udp4", netGuestIP+":5003")
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 100)
		for i := 0; i < netUDP; i++ {
			binary.BigEndian.PutUint32(buf, uint32(i))
			if _, err := c.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
		var got string
		if sc.Scan() {
			got = sc.Text()
		}
		go io.Copy(io.Discard, pr)
		if e := <-res; e != "" {
			t.Fatal(e)
		}
		if got != fmt.Sprintf("got %d", netUDP) {
			t.Fatalf("guest: %q, want got %d", got, netUDP)
		}
	})
	t.Run("udp guest to host", func(t *testing.T) {
		c, err := net.ListenPacket("udp4", netHostIP+":5004")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if rc, err := c.(*net.UDPConn).SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
			})
		}
		seen := map[uint32]bool{}
		var mu sync.Mutex
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 2048)
			for {
				n, _, err := c.ReadFrom(buf)
				if err != nil {
					return
				}
				if n >= 4 {
					mu.Lock()
					seen[binary.BigEndian.Uint32(buf)] = true
					mu.Unlock()
				}
			}
		}()
		g.sh(fmt.Sprintf("nettest udp-send %s:5004 %d 100", netHostIP, netUDP))
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(seen)
			mu.Unlock()
			if n == netUDP {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("host received %d of %d datagrams", n, netUDP)
			}
			time.Sleep(10 * time.Millisecond)
		}
		c.Close()
		<-done
	})
	if s := m.NetStats(0); s.TxErrors != 0 || s.TxDropped != 0 {
		t.Errorf("device counted errors: %+v", s)
	}
}

// netGuest runs commands through the agent.
type netGuest struct {
	t   *testing.T
	ctx context.Context
	c   *agentapi.Client
}

// run runs cmd and returns "" or what went wrong, with its stderr.
func (g *netGuest) run(cmd *agentapi.Cmd) string {
	var stderr bytes.Buffer
	cmd.Env = []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"}
	cmd.Stderr = &stderr
	st, err := g.c.Exec(g.ctx, cmd)
	switch {
	case err != nil:
		return fmt.Sprintf("%v: %v; stderr: %s", cmd.Argv, err, stderr.String())
	case st.Code != 0 || st.Signal != 0:
		return fmt.Sprintf("%v: exit %d signal %d; stderr: %s", cmd.Argv, st.Code, st.Signal, stderr.String())
	}
	return ""
}

// shErr runs a shell line and returns its stdout, or the failure.
func (g *netGuest) shErr(line string) string {
	var out bytes.Buffer
	if e := g.run(&agentapi.Cmd{Argv: []string{"/bin/sh", "-c", line}, Stdout: &out}); e != "" {
		return e
	}
	return out.String()
}

// sh runs a shell line in the guest and fails the test if it fails.
func (g *netGuest) sh(line string) string {
	g.t.Helper()
	var out bytes.Buffer
	if e := g.run(&agentapi.Cmd{Argv: []string{"/bin/sh", "-c", line}, Stdout: &out}); e != "" {
		g.t.Fatalf("guest: %s", e)
	}
	return out.String()
}

// hostIP runs busybox ip on the host (in the test's namespace).
func hostIP(t *testing.T, busybox string, args ...string) {
	t.Helper()
	if out, err := exec.Command(busybox, append([]string{"ip"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// netTestHelper returns the static guest helper (testenv.NetTest).
func netTestHelper(t *testing.T) string { return testenv.NetTest(t) }
