package microvm_test

import (
	"bytes"
	"context"
	"io"
	"math/rand"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/testing/consoletest"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestDebianCloudKernel boots Debian's own linux-image-cloud-amd64 under
// microvm (make debian-kernel). That kernel builds virtio_mmio as a module
// without command-line device support, so it finds the vsock device only
// through the DSDT's LNRO0005 entry. Its initramfs holds guest/init and the
// modules, which /init loads in dependency order; /init then runs the echo
// scenario, the host echoes 1 MiB through DialVsock, and /init powers the
// machine off through ACPI. The bzImage decompresses slowly in the
// nested-KVM box: the bound is minutes.
func TestDebianCloudKernel(t *testing.T) {
	kernel, initrd := testenv.DebianKernel(t) // before RequireKVM: the box has no network
	if kernel == "" {
		return
	}
	testenv.RequireKVM(t, testenv.NeedLinux)
	out := consoletest.New()
	log, logged := logBuffer()
	m, err := microvm.New(microvm.Config{
		Kernel: kernel, Initrd: initrd, CPUs: 2, MemoryBytes: 512 << 20, Console: out, Log: log,
		Cmdline: "console=ttyS0 panic=-1 microvm.scenarios=echo microvm.echo.conns=1 microvm.timeout=600s",
		Vsock:   &microvm.VsockConfig{CID: 3, UDSPath: filepath.Join(t.TempDir(), "v.sock")},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	type ran struct {
		res microvm.Result
		err error
	}
	done := make(chan ran, 1)
	stopped := make(chan struct{})
	go func() {
		r, err := m.Run(ctx)
		done <- ran{r, err}
		close(stopped)
	}()
	if !out.WaitFor("init: scenario echo listening", 9*time.Minute, stopped) {
		cancel()
		<-stopped
		t.Fatalf("the guest's echo scenario never listened (%v); log:\n%s\nconsole:\n%s", time.Since(start), logged, out)
	}
	t.Logf("/init listening on vsock %v after New", time.Since(start).Round(time.Millisecond))

	conn, err := m.DialVsock(ctx, 1024)
	if err != nil {
		t.Fatalf("DialVsock: %v; console:\n%s", err, out)
	}
	data := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(data)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok && err == nil {
			err = cw.CloseWrite()
		}
		werr <- err
	}()
	got, rerr := io.ReadAll(conn)
	conn.Close()
	if err := <-werr; err != nil || rerr != nil {
		t.Fatalf("echo: write %v, read %v", err, rerr)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("echo returned %d bytes, not the %d sent", len(got), len(data))
	}

	r := <-done
	if r.err != nil || r.res.Kind != microvm.ExitPowerOff {
		t.Fatalf("run ended with %v, err %v; want an ACPI power-off; log:\n%s\nconsole:\n%s", r.res.Kind, r.err, logged, out)
	}
	c := out.String()
	for _, want := range []string{"init: module /lib/modules/virtio_mmio.ko loaded", "init: vsock cid=3",
		"init: scenario echo ok", "init: done ok", "reboot: Power down"} {
		if !strings.Contains(c, want) {
			t.Errorf("console lacks %q:\n%s", want, c)
		}
	}
	checkACPIQuiet(t, c)
	if testing.Verbose() {
		t.Logf("console:\n%s", c)
	}
	t.Logf("Debian's kernel booted, echoed over vsock and powered off %v after New", time.Since(start).Round(time.Millisecond))
}

// checkACPIQuiet fails the test when a Linux console shows ACPICA
// complaining about microvm's tables ("ACPI Error", "ACPI BIOS Error",
// "ACPI Warning", "ACPI BIOS Warning").
func checkACPIQuiet(t *testing.T, console string) {
	t.Helper()
	for _, line := range strings.Split(console, "\n") {
		if strings.Contains(line, "ACPI Error") || strings.Contains(line, "ACPI BIOS Error") ||
			strings.Contains(line, "ACPI Warning") || strings.Contains(line, "ACPI BIOS Warning") {
			t.Errorf("console: %s", strings.TrimSpace(line))
		}
	}
}
