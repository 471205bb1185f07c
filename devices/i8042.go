package devices

import "sync"

// i8042 ports and the commands microvm understands (IBM PC/AT technical
// reference; Linux drivers/input/serio/i8042.h).
const (
	I8042DataPort    = 0x60
	I8042CommandPort = 0x64

	i8042CmdReadCTR   = 0x20
	i8042CmdWriteCTR  = 0x60
	i8042CmdDisAux    = 0xa7
	i8042CmdEnAux     = 0xa8
	i8042CmdAuxTest   = 0xa9
	i8042CmdSelfTest  = 0xaa
	i8042CmdKbdTest   = 0xab
	i8042CmdDisKbd    = 0xad
	i8042CmdEnKbd     = 0xae
	i8042CmdWriteOut  = 0xd1
	i8042CmdPulseBase = 0xf0 // 0xf0-0xff pulse output lines; bit 0 clear pulses reset

	i8042StatusOBF = 0x01 // output buffer full
	i8042StatusSys = 0x04 // system flag (self test passed)
	i8042StatusCmd = 0x08 // last write was a command

	i8042SelfTestOK = 0x55

	// i8042QueueMax bounds the reply bytes queued for the guest.
	i8042QueueMax = 16
)

// I8042 is the PC keyboard controller, reduced to what guests use to reset
// the machine: the 0xfe pulse-reset command (Linux reboot=k), a write of the
// output port with the reset bit clear, and enough of the command set for a
// driver probe to complete. No keyboard is attached.
type I8042 struct {
	// Reset is called when the guest resets the machine. It must not block.
	Reset func()

	mu      sync.Mutex // guards the fields below
	ctr     byte       // controller configuration ("command byte")
	pending byte       // command waiting for its data byte, or 0
	out     []byte     // bytes for the guest to read from the data port
	status  byte
}

// NewI8042 returns a controller that calls reset on a reset request.
func NewI8042(reset func()) *I8042 {
	return &I8042{Reset: reset, ctr: 0x30 /* both ports' clocks off, no IRQs */, status: i8042StatusSys}
}

// DataPort is the one-byte data port (0x60), as a bus device.
func (k *I8042) DataPort() Device { return i8042Port{k, false} }

// CommandPort is the one-byte command and status port (0x64), as a bus
// device.
func (k *I8042) CommandPort() Device { return i8042Port{k, true} }

type i8042Port struct {
	k   *I8042
	cmd bool
}

func (p i8042Port) Read(_ uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	clear(data)
	k := p.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if p.cmd {
		data[0] = k.status
		if len(k.out) > 0 {
			data[0] |= i8042StatusOBF
		}
		return
	}
	if len(k.out) > 0 {
		data[0] = k.out[0]
		k.out = k.out[1:]
	}
}

func (p i8042Port) Write(_ uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	v := data[0]
	k := p.k
	k.mu.Lock()
	reset := false
	if p.cmd {
		k.status |= i8042StatusCmd
		k.pending = 0
		switch {
		case v == i8042CmdReadCTR:
			k.push(k.ctr)
		case v == i8042CmdWriteCTR, v == i8042CmdWriteOut:
			k.pending = v
		case v == i8042CmdSelfTest:
			k.push(i8042SelfTestOK)
		case v == i8042CmdKbdTest, v == i8042CmdAuxTest:
			k.push(0x00)
		case v == i8042CmdDisKbd:
			k.ctr |= 0x10
		case v == i8042CmdEnKbd:
			k.ctr &^= 0x10
		case v == i8042CmdDisAux:
			k.ctr |= 0x20
		case v == i8042CmdEnAux:
			k.ctr &^= 0x20
		case v >= i8042CmdPulseBase:
			reset = v&1 == 0 // 0xfe: pulse the reset line
		}
	} else {
		k.status &^= i8042StatusCmd
		switch k.pending {
		case i8042CmdWriteCTR:
			k.ctr = v
		case i8042CmdWriteOut:
			reset = v&1 == 0 // output port bit 0 low holds the CPU in reset
		default:
			// A byte for the (absent) keyboard: acknowledge it.
			k.push(0xfa)
		}
		k.pending = 0
	}
	k.mu.Unlock()
	if reset && k.Reset != nil {
		k.Reset()
	}
}

// push queues a reply byte, keeping at most a few (a real controller has one).
func (k *I8042) push(b byte) {
	if len(k.out) < i8042QueueMax {
		k.out = append(k.out, b)
	}
}
