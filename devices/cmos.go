package devices

import (
	"sync"
	"time"
)

// CMOS ports: index (bit 7 is the NMI mask) and data.
const (
	CMOSPort  = 0x70
	CMOSPorts = 2
)

// MC146818 RTC registers and the memory-size bytes PC firmware keeps in CMOS
// (Linux arch/x86/include/asm/mc146818rtc.h; the memory bytes as SeaBIOS and
// QEMU define them).
const (
	rtcSeconds  = 0x00
	rtcMinutes  = 0x02
	rtcHours    = 0x04
	rtcWeekday  = 0x06
	rtcDay      = 0x07
	rtcMonth    = 0x08
	rtcYear     = 0x09
	rtcStatusA  = 0x0a
	rtcStatusB  = 0x0b
	rtcStatusC  = 0x0c
	rtcStatusD  = 0x0d
	rtcCentury  = 0x32
	cmosBaseLo  = 0x15 // base memory in KiB
	cmosExtLo   = 0x17 // memory 1 MiB..64 MiB in KiB
	cmosExt2Lo  = 0x30 // same, second copy
	cmosHigh16  = 0x34 // memory 16 MiB..4 GiB in 64 KiB units
	cmosHigh4G  = 0x5b // memory above 4 GiB in 64 KiB units (3 bytes)
	statusB24h  = 0x02
	statusDVRT  = 0x80 // valid RAM and time
	statusADiv  = 0x26 // 32.768 kHz time base, 1024 Hz rate
	statusAUIP  = 0x80 // update in progress (read-only)
	cmosEntries = 128
)

// CMOS is the battery-backed RTC and NVRAM: the time of day in BCD, 24-hour
// mode, from the host clock, and the memory size bytes. Other bytes are
// plain storage.
type CMOS struct {
	Now func() time.Time // time source (time.Now if nil)

	mu    sync.Mutex // guards index and nvram
	index byte
	nvram [cmosEntries]byte
}

// NewCMOS returns a CMOS describing lowMem bytes of RAM below 4 GiB and
// highMem above it.
func NewCMOS(lowMem, highMem uint64) *CMOS {
	c := &CMOS{}
	c.nvram[rtcStatusA] = statusADiv
	c.nvram[rtcStatusB] = statusB24h
	c.nvram[rtcStatusD] = statusDVRT
	put16 := func(at int, v uint64) {
		v = min(v, 0xffff)
		c.nvram[at] = byte(v)
		c.nvram[at+1] = byte(v >> 8)
	}
	put16(cmosBaseLo, 640)
	if lowMem > 1<<20 {
		ext := (min(lowMem, 64<<20) - 1<<20) >> 10
		put16(cmosExtLo, ext)
		put16(cmosExt2Lo, ext)
	}
	if lowMem > 16<<20 {
		put16(cmosHigh16, (lowMem-16<<20)>>16)
	}
	hi := highMem >> 16
	c.nvram[cmosHigh4G] = byte(hi)
	c.nvram[cmosHigh4G+1] = byte(hi >> 8)
	c.nvram[cmosHigh4G+2] = byte(hi >> 16)
	return c
}

func bcd(v int) byte { return byte(v/10<<4 | v%10) }

// Read implements Device.
func (c *CMOS) Read(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	clear(data)
	c.mu.Lock()
	defer c.mu.Unlock()
	if offset == 0 {
		data[0] = c.index
		return
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	switch i := c.index & 0x7f; i {
	case rtcSeconds, rtcMinutes, rtcHours, rtcWeekday, rtcDay, rtcMonth, rtcYear, rtcCentury:
		t := now().UTC()
		data[0] = bcd(map[byte]int{
			rtcSeconds: t.Second(), rtcMinutes: t.Minute(), rtcHours: t.Hour(),
			rtcWeekday: int(t.Weekday()) + 1, rtcDay: t.Day(), rtcMonth: int(t.Month()),
			rtcYear: t.Year() % 100, rtcCentury: t.Year() / 100,
		}[i])
	case rtcStatusC:
		data[0] = 0 // no interrupt flags; reading clears them
	default:
		data[0] = c.nvram[i]
	}
}

// Write implements Device.
func (c *CMOS) Write(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if offset == 0 {
		c.index = data[0]
		return
	}
	switch i := c.index & 0x7f; i {
	case rtcStatusC, rtcStatusD:
		// read-only
	case rtcStatusA:
		c.nvram[i] = data[0] &^ statusAUIP // UIP is read-only
	default:
		c.nvram[i] = data[0]
	}
}

// PortBPort is the PC's system control port B.
const PortBPort = 0x61

// PortB is system control port B for a machine without an i8254: no speaker
// gate or timer-2 output, and no NMI sources, so it reads 0 except for the
// refresh-request bit, which toggles on each read as on a PC (some code
// waits for it to change).
type PortB struct {
	mu      sync.Mutex // guards refresh
	refresh bool
}

// Read implements Device.
func (p *PortB) Read(_ uint64, data []byte) {
	clear(data)
	if len(data) == 0 {
		return
	}
	p.mu.Lock()
	p.refresh = !p.refresh
	if p.refresh {
		data[0] = 1 << 4
	}
	p.mu.Unlock()
}

// Write implements Device: the speaker and NMI-mask bits have nothing to
// control.
func (p *PortB) Write(uint64, []byte) {}

// PortBState is the snapshot form of a PortB (see state.go): the refresh
// bit's level as the guest last read it. Fields are matched by name when
// decoded; a field added later must default (zero) to the behaviour of a
// snapshot that lacks it.
type PortBState struct {
	Refresh bool // bit 4 was set in the last read
}

// SaveState returns the port's state.
func (p *PortB) SaveState() PortBState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PortBState{Refresh: p.refresh}
}

// RestoreState replaces the port's state with st. Every PortBState is
// valid: the error is there to implement Stateful.
func (p *PortB) RestoreState(st PortBState) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refresh = st.Refresh
	return nil
}
