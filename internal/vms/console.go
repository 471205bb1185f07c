package vms

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"golang.org/x/sys/unix"
)

// ConsoleMax bounds each of a VM's two console files: the console goes to
// one until it holds ConsoleMax bytes, then the other is emptied and takes
// over, so a VM's console costs at most twice this on disk however long it
// runs, and the last ConsoleMax bytes at least are always there.
const ConsoleMax = 1 << 20

// ConsoleLog is a VM's console, in two files written in turn
// (console.log, console.log.1). Both are opened by OpenConsoleLog, before
// the VM's process is confined: switching files is an ftruncate, not an
// open or a rename. Safe for concurrent writes (the UART's line writer and
// its flush timer). A write error stops the logging (the VM does not stop
// for it) and is reported by Close.
type ConsoleLog struct {
	max int64

	mu     sync.Mutex // guards files, active, size, err
	files  [2]*os.File
	active int
	size   int64
	err    error
}

// OpenConsoleLog creates (emptying) dir's two console files.
func OpenConsoleLog(dir string, max int64) (*ConsoleLog, error) {
	c := &ConsoleLog{max: max}
	for i, name := range []string{ConsoleFile, ConsoleFile + ".1"} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("console log: %w", err)
		}
		c.files[i] = f
	}
	return c, nil
}

var _ io.WriteCloser = (*ConsoleLog)(nil)

// Write appends p, first switching files when p would take the active one
// past max. It always reports len(p): the console is never held up by its
// log.
func (c *ConsoleLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.files[c.active] == nil {
		return len(p), nil
	}
	if c.size > 0 && c.size+int64(len(p)) > c.max {
		next := 1 - c.active
		if err := unix.Ftruncate(int(c.files[next].Fd()), 0); err != nil {
			c.err = err
			return len(p), nil
		}
		c.active, c.size = next, 0
	}
	n, err := c.files[c.active].Write(p)
	c.size += int64(n)
	if err != nil {
		c.err = err
	}
	return len(p), nil
}

// Close closes the files and returns the first write error, if any.
func (c *ConsoleLog) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, f := range c.files {
		if f != nil {
			if err := f.Close(); err != nil && c.err == nil {
				c.err = err
			}
			c.files[i] = nil
		}
	}
	if c.err != nil {
		return fmt.Errorf("console log: %w", c.err)
	}
	return nil
}

// ReadConsole returns what a VM's console files hold, the older first: by
// modification time, and for two written within one tick of the clock the
// fuller first (the other began empty when it took over).
func ReadConsole(dir string) ([]byte, error) {
	type part struct {
		b   []byte
		mod int64
	}
	var parts []part
	for _, name := range []string{ConsoleFile, ConsoleFile + ".1"} {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if os.IsNotExist(err) {
			continue
		} else if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		parts = append(parts, part{b, fi.ModTime().UnixNano()})
	}
	sort.SliceStable(parts, func(i, j int) bool {
		if parts[i].mod != parts[j].mod {
			return parts[i].mod < parts[j].mod
		}
		return len(parts[i].b) > len(parts[j].b)
	})
	var out []byte
	for _, p := range parts {
		out = append(out, p.b...)
	}
	return out, nil
}
