package conformance

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// microvmConfig is one machine configuration of microvm run.
type microvmConfig struct {
	name    string
	irqchip string // --irqchip
	cpus    int    // --cpus
	bzImage bool   // boot build/kernel/bzImage rather than vmlinux
}

// microvmTarget is a microvm run process: the guest's virtio-vsock device
// on microvm's own virtio-mmio transport (ioeventfd kicks, irqfd
// interrupts), its host socket --vsock-uds.
type microvmTarget struct {
	art    artefacts
	kernel string // vmlinux or bzImage
	cfg    microvmConfig
	dir    string // short temporary directory for the sockets
}

func (m *microvmTarget) uds() string { return filepath.Join(m.dir, "v.sock") }

// args is microvm run's command line; microvm appends the
// virtio_mmio.device= parameter for its device to the command line itself.
func (m *microvmTarget) args(params []string) []string {
	return []string{"run", "--kernel", m.kernel, "--initrd", m.art.initrd,
		"--cmdline", guestCmdline("k", params),
		"--cpus", strconv.Itoa(m.cfg.cpus), "--irqchip", m.cfg.irqchip,
		"--vsock-cid", strconv.Itoa(guestCID), "--vsock-uds", m.uds(),
		"--log-level", "info"}
}

func (m *microvmTarget) boot(t *testing.T, params []string) *vm {
	return startVM(t, "microvm", exec.Command(m.art.microvm, m.args(params)...))
}

// needMicrovm skips the test where this host's KVM cannot run Linux
// (testenv.RequireKVM queues it for the nested-KVM box under make test),
// and returns the artefacts plus the bzImage.
func needMicrovm(t *testing.T) (artefacts, string) {
	t.Helper()
	suiteEnabled(t)
	testenv.RequireKVM(t, testenv.NeedLinux)
	a := artefacts{kernel: testenv.Kernel(t), microvm: testenv.Binary(t), initrd: testenv.Initrd(t)}
	return a, testenv.BzImage(t)
}

// TestMicrovm runs TestModern's data scenarios against microvm run itself:
// the same vsock device as the back-end's, behind microvm's virtio-mmio
// transport with real guest interrupts, on both interrupt-controller
// models, on two vCPUs and on one, booting the vmlinux and the bzImage.
// After the guest's ACPI power-off (its kernel has ACPI, microvm's
// tables are on by default) microvm must exit with status 0 and must have
// logged no warning or error. The vsock device is announced both in the
// DSDT and on the command line (virtio_mmio.device=): the kernel binds the
// ACPI one, and the scenarios prove the device works that way.
func TestMicrovm(t *testing.T) {
	a, bz := needMicrovm(t)
	for _, cfg := range []microvmConfig{
		{name: "split-2cpus", irqchip: "split", cpus: 2},
		{name: "kernel-2cpus", irqchip: "kernel", cpus: 2},
		{name: "split-1cpu-bzImage", irqchip: "split", cpus: 1, bzImage: true},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			m := &microvmTarget{art: a, kernel: a.kernel, cfg: cfg, dir: shortTempDir(t)}
			if cfg.bzImage {
				m.kernel = bz
			}
			v := runData(t, m)
			v.finish(t)
			v.waitLog(t, `msg="guest stopped" reason=power-off status=0`, 1)
			v.checkClean(t)
		})
	}
}
