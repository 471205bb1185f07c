package virtio_test

import (
	"testing"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

func TestQueueConfigValidate(t *testing.T) {
	const mem = 1 << 20
	const n = 256
	good := virtio.QueueConfig{Size: n, Desc: 0x1000, Avail: 0x2000, Used: 0x3000}
	with := func(f func(c *virtio.QueueConfig)) virtio.QueueConfig {
		c := good
		f(&c)
		return c
	}
	tests := []struct {
		name    string
		cfg     virtio.QueueConfig
		max     uint16
		wantErr bool
	}{
		{"good", good, n, false},
		{"size 1", with(func(c *virtio.QueueConfig) { c.Size = 1 }), n, false},
		{"size 0", with(func(c *virtio.QueueConfig) { c.Size = 0 }), n, true},
		{"size 3", with(func(c *virtio.QueueConfig) { c.Size = 3 }), n, true},
		{"size 6", with(func(c *virtio.QueueConfig) { c.Size = 6 }), n, true},
		{"size 255", with(func(c *virtio.QueueConfig) { c.Size = 255 }), n, true},
		{"size above the device's max", with(func(c *virtio.QueueConfig) { c.Size = 2 * n }), n, true},
		{"smaller than the device's max", with(func(c *virtio.QueueConfig) { c.Size = 64 }), n, false},
		{"device max 0", with(func(c *virtio.QueueConfig) { c.Size = 1 }), 0, true},
		{"size 32768", virtio.QueueConfig{Size: 32768, Desc: 0x1000, Avail: 0x90000, Used: 0xb0000}, virtio.MaxQueueSize, false},
		{"desc 8-aligned", with(func(c *virtio.QueueConfig) { c.Desc = 0x1008 }), n, true},
		{"desc odd", with(func(c *virtio.QueueConfig) { c.Desc = 0x1001 }), n, true},
		{"avail 2-aligned", with(func(c *virtio.QueueConfig) { c.Avail = 0x2002 }), n, false},
		{"avail odd", with(func(c *virtio.QueueConfig) { c.Avail = 0x2001 }), n, true},
		{"used 4-aligned", with(func(c *virtio.QueueConfig) { c.Used = 0x3004 }), n, false},
		{"used 2-aligned", with(func(c *virtio.QueueConfig) { c.Used = 0x3002 }), n, true},
		{"used odd", with(func(c *virtio.QueueConfig) { c.Used = 0x3001 }), n, true},
		{"desc ends at the end of memory", with(func(c *virtio.QueueConfig) { c.Desc = mem - 16*n }), n, false},
		{"desc one entry past the end", with(func(c *virtio.QueueConfig) { c.Desc = mem - 16*n + 16 }), n, true},
		{"avail with used_event at the end", with(func(c *virtio.QueueConfig) { c.Avail = mem - (6 + 2*n) }), n, false},
		{"avail without room for used_event", with(func(c *virtio.QueueConfig) { c.Avail = mem - (4 + 2*n) }), n, true},
		{"used with avail_event inside memory", with(func(c *virtio.QueueConfig) { c.Used = mem - (8 + 8*n) }), n, false},
		{"used without room for avail_event", with(func(c *virtio.QueueConfig) { c.Used = mem - (4 + 8*n) }), n, true},
		{"desc outside memory", with(func(c *virtio.QueueConfig) { c.Desc = 1 << 40 }), n, true},
		{"avail outside memory", with(func(c *virtio.QueueConfig) { c.Avail = mem }), n, true},
		{"used outside memory", with(func(c *virtio.QueueConfig) { c.Used = 1 << 40 }), n, true},
		{"desc wraps the address space", with(func(c *virtio.QueueConfig) { c.Desc = ^uint64(0) &^ 15 }), n, true},
		{"used wraps the address space", with(func(c *virtio.QueueConfig) { c.Used = ^uint64(0) &^ 3 }), n, true},
	}
	m := virtiotest.NewMemory(t, mem)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate(m.Memory, tt.max)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Validate(%+v, max %d) = %v; want error %v", tt.cfg, tt.max, err, tt.wantErr)
			}
			if err != nil {
				wantGuestErr(t, "Validate", err)
			}
		})
	}
}
