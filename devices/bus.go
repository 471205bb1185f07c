package devices

import (
	"fmt"
	"sort"
	"sync/atomic"
)

// Device is something on a bus. Offsets are relative to the start of the
// range the device was registered at; len(data) is the access width. Read
// fills data.
type Device interface {
	// Read handles a guest read of len(data) bytes at offset.
	Read(offset uint64, data []byte)
	// Write handles a guest write of data at offset.
	Write(offset uint64, data []byte)
}

type busEntry struct {
	base, size uint64
	name       string
	dev        Device
}

// Bus routes accesses by address range (port numbers on the I/O bus,
// guest-physical addresses on the MMIO bus).
type Bus struct {
	name      string
	entries   []busEntry // sorted by base, non-overlapping
	unclaimed atomic.Uint64
}

// NewBus returns an empty bus; name is used in messages ("pio", "mmio").
func NewBus(name string) *Bus { return &Bus{name: name} }

// Register claims [base, base+size) for dev. Overlaps are refused. Call it
// only before vCPUs run.
func (b *Bus) Register(base, size uint64, name string, dev Device) error {
	if size == 0 || base+size < base {
		return fmt.Errorf("%s bus: bad range %#x+%#x for %s", b.name, base, size, name)
	}
	i := sort.Search(len(b.entries), func(i int) bool { return b.entries[i].base >= base })
	if i > 0 && b.entries[i-1].base+b.entries[i-1].size > base {
		return fmt.Errorf("%s bus: %s at %#x overlaps %s", b.name, name, base, b.entries[i-1].name)
	}
	if i < len(b.entries) && base+size > b.entries[i].base {
		return fmt.Errorf("%s bus: %s at %#x overlaps %s", b.name, name, base, b.entries[i].name)
	}
	b.entries = append(b.entries, busEntry{})
	copy(b.entries[i+1:], b.entries[i:])
	b.entries[i] = busEntry{base: base, size: size, name: name, dev: dev}
	return nil
}

func (b *Bus) find(addr uint64, n int) (*busEntry, bool) {
	i := sort.Search(len(b.entries), func(i int) bool { return b.entries[i].base+b.entries[i].size > addr })
	if i == len(b.entries) {
		return nil, false
	}
	e := &b.entries[i]
	if addr < e.base || uint64(n) > e.base+e.size-addr {
		return nil, false
	}
	return e, true
}

// Read dispatches a read of len(data) bytes at addr. It reports whether a
// device claimed it; an unclaimed read returns all-ones.
func (b *Bus) Read(addr uint64, data []byte) bool {
	e, ok := b.find(addr, len(data))
	if !ok {
		b.unclaimed.Add(1)
		for i := range data {
			data[i] = 0xff
		}
		return false
	}
	e.dev.Read(addr-e.base, data)
	return true
}

// Write dispatches a write. It reports whether a device claimed it; an
// unclaimed write is dropped.
func (b *Bus) Write(addr uint64, data []byte) bool {
	e, ok := b.find(addr, len(data))
	if !ok {
		b.unclaimed.Add(1)
		return false
	}
	e.dev.Write(addr-e.base, data)
	return true
}

// Unclaimed counts accesses no device claimed.
func (b *Bus) Unclaimed() uint64 { return b.unclaimed.Load() }
