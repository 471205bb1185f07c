package named

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/microvm/microvm/internal/vms"
)

// logPollInterval is how often Logs with follow looks for more console
// output and whether the VM still runs.
const logPollInterval = 200 * time.Millisecond

// Logs writes the named VM name's console log to w (a running VM's or a
// stopped one's whose record is kept): the rotated part, then the current
// one. With follow it goes on writing what the console says next until
// the VM ends or ctx does, and then returns nil.
func Logs(ctx context.Context, w io.Writer, name string, follow bool) error {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return err
	}
	e, err := store.Get(name)
	if err != nil {
		return err
	}
	b, err := vms.ReadConsole(e.Dir)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil || !follow {
		return err
	}
	path := filepath.Join(e.Dir, vms.ConsoleFile)
	var off int64
	if fi, err := os.Stat(path); err == nil {
		off = fi.Size()
	}
	tick := time.NewTicker(logPollInterval)
	defer tick.Stop()
	for {
		n, err := copyFrom(w, path, off)
		if err != nil {
			return err
		}
		off = n
		if g, err := store.Get(name); err != nil || !g.Alive {
			// One more look: what the VM wrote as it ended.
			_, err := copyFrom(w, path, off)
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// copyFrom writes to w what the console file at path holds past off, and
// returns the offset after it: from 0 again when the file was rotated
// (shorter than off). A file that is not there yet writes nothing.
func copyFrom(w io.Writer, path string, off int64) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return off, nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() < off {
		off = 0
	}
	n, err := io.Copy(w, io.NewSectionReader(f, off, 1<<62))
	return off + n, err
}
