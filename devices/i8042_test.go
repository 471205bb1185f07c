package devices

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// kbc drives an I8042 through its two ports as a guest would.
type kbc struct {
	k      *I8042
	data   Device
	cmd    Device
	resets int
}

func newKBC() *kbc {
	c := &kbc{}
	c.k = NewI8042(func() { c.resets++ })
	c.data, c.cmd = c.k.DataPort(), c.k.CommandPort()
	return c
}

func (c *kbc) command(v byte)   { c.cmd.Write(0, []byte{v}) }
func (c *kbc) writeData(v byte) { c.data.Write(0, []byte{v}) }
func (c *kbc) status() byte     { return readByte(c.cmd) }
func (c *kbc) readData() byte   { return readByte(c.data) }
func readByte(d Device) byte    { b := []byte{0xaa}; d.Read(0, b); return b[0] }
func (c *kbc) outputFull() bool { return c.status()&i8042StatusOBF != 0 }
func (c *kbc) drain() (b []byte) {
	for c.outputFull() {
		b = append(b, c.readData())
	}
	return b
}

func TestI8042Reset(t *testing.T) {
	tests := []struct {
		name       string
		do         func(c *kbc)
		wantResets int
	}{
		{"0xfe pulses reset", func(c *kbc) { c.command(0xfe) }, 1},
		{"0xf0 pulses all lines including reset", func(c *kbc) { c.command(0xf0) }, 1},
		{"0xff pulses nothing", func(c *kbc) { c.command(0xff) }, 0},
		{"0xfd pulses line 1 only", func(c *kbc) { c.command(0xfd) }, 0},
		{"write output port with bit 0 clear", func(c *kbc) { c.command(0xd1); c.writeData(0xfe) }, 1},
		{"write output port with bit 0 set", func(c *kbc) { c.command(0xd1); c.writeData(0xdf) }, 0},
		{"data byte without 0xd1 is for the keyboard", func(c *kbc) { c.writeData(0x00) }, 0},
		{"0xd1 cancelled by another command", func(c *kbc) { c.command(0xd1); c.command(0x20); c.writeData(0x00) }, 0},
		{"reset twice", func(c *kbc) { c.command(0xfe); c.command(0xfe) }, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newKBC()
			tc.do(c)
			if c.resets != tc.wantResets {
				t.Errorf("resets = %d, want %d", c.resets, tc.wantResets)
			}
		})
	}
}

func TestI8042NilReset(t *testing.T) {
	k := NewI8042(nil)
	k.CommandPort().Write(0, []byte{0xfe}) // must not panic
}

func TestI8042Commands(t *testing.T) {
	tests := []struct {
		name string
		do   func(c *kbc)
		want []byte // bytes the guest then reads from the data port
	}{
		{"self test", func(c *kbc) { c.command(0xaa) }, []byte{0x55}},
		{"keyboard interface test", func(c *kbc) { c.command(0xab) }, []byte{0x00}},
		{"aux interface test", func(c *kbc) { c.command(0xa9) }, []byte{0x00}},
		{"read CTR at reset", func(c *kbc) { c.command(0x20) }, []byte{0x30}},
		{"write then read CTR", func(c *kbc) { c.command(0x60); c.writeData(0x47); c.command(0x20) }, []byte{0x47}},
		{"disable keyboard sets CTR bit 4", func(c *kbc) { c.command(0x60); c.writeData(0); c.command(0xad); c.command(0x20) }, []byte{0x10}},
		{"enable keyboard clears CTR bit 4", func(c *kbc) { c.command(0xae); c.command(0x20) }, []byte{0x20}},
		{"disable aux sets CTR bit 5", func(c *kbc) { c.command(0x60); c.writeData(0); c.command(0xa7); c.command(0x20) }, []byte{0x20}},
		{"enable aux clears CTR bit 5", func(c *kbc) { c.command(0xa8); c.command(0x20) }, []byte{0x10}},
		{"keyboard byte is acknowledged", func(c *kbc) { c.writeData(0xf4) }, []byte{0xfa}},
		{"replies queue in order", func(c *kbc) { c.command(0xaa); c.command(0x20) }, []byte{0x55, 0x30}},
		{"unknown command: no reply", func(c *kbc) { c.command(0xc0) }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newKBC()
			tc.do(c)
			if diff := cmp.Diff(tc.want, c.drain()); diff != "" {
				t.Errorf("data port (-want +got):\n%s", diff)
			}
			if c.resets != 0 {
				t.Errorf("%d resets", c.resets)
			}
		})
	}
}

func TestI8042Status(t *testing.T) {
	c := newKBC()
	if got := c.status(); got != i8042StatusSys {
		t.Errorf("status at reset = %#x, want system flag only (%#x)", got, i8042StatusSys)
	}
	c.command(0xaa)
	if got := c.status(); got != i8042StatusSys|i8042StatusCmd|i8042StatusOBF {
		t.Errorf("status after a command with a reply = %#x, want SYS|CMD|OBF", got)
	}
	c.readData()
	if got := c.status(); got&i8042StatusOBF != 0 {
		t.Errorf("status = %#x after reading the reply, want OBF clear", got)
	}
	c.writeData(0x00)
	if got := c.status(); got&i8042StatusCmd != 0 {
		t.Errorf("status = %#x after a data write, want the command bit clear", got)
	}
	if got := c.readData(); got != 0xfa {
		t.Errorf("data = %#x, want the keyboard ACK", got)
	}
	if got := c.readData(); got != 0 {
		t.Errorf("data port with nothing queued = %#x, want 0", got)
	}
	// The output queue is bounded.
	for range 100 {
		c.command(0xaa)
	}
	if n := len(c.drain()); n != 16 {
		t.Errorf("%d bytes queued after 100 self tests, want the 16-byte cap", n)
	}
}
