package agentvm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// shRunner runs the guest scripts with this host's sh, as the agent runs
// them in the guest: status and output, never an error for a status.
type shRunner struct{}

func (shRunner) Run(ctx context.Context, argv []string) (int, string, error) {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out), nil
	}
	return 0, string(out), err
}

func TestMountDiskNoDisk(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	target := filepath.Join(t.TempDir(), "cache")
	st, out, err := MountDisk(context.Background(), shRunner{}, "no-such-serial-7c1e", target)
	if err != nil || st != 1 || !strings.Contains(out, "no disk with serial no-such-serial-7c1e") {
		t.Errorf("status %d, %v, output %q: want 1 and the serial named", st, err, out)
	}
	if _, err := os.Stat(target); err == nil {
		t.Errorf("%s made though no disk was found", target)
	}
}

func TestUnmountDiskNotMounted(t *testing.T) {
	if _, err := exec.LookPath("umount"); err != nil {
		t.Skip("no umount")
	}
	st, out, err := UnmountDisk(context.Background(), shRunner{}, t.TempDir())
	if err != nil || st != 1 || strings.TrimSpace(out) == "" {
		t.Errorf("status %d, %v, output %q: want 1 and umount's message", st, err, out)
	}
}
